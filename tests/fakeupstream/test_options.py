"""The fake's per-request options: headers and body merged, cast and checked by one schema."""
from __future__ import annotations

import pytest

from fakeupstream.plan import parse_options


def test_headers_are_cast_and_the_body_wins():
    o = parse_options({"x-fake-ttft-ms": "5", "x-fake-no-role": "true", "x-fake-tokens": "3"},
                      {"tokens": 7, "fault": 429})
    assert (o.ttft_ms, o.no_role, o.tokens, o.fault) == (5.0, True, 7, "429")
    assert parse_options({}, None).fault == "" and parse_options({}, None).ttft_ms is None


@pytest.mark.parametrize("fake,where", [
    ({"nonsense": 1}, "fake.nonsense"), ({"fault": "melt"}, "fake.fault"),
    ({"ttft_ms": -1}, "fake.ttft_ms"), ({"itl_ms": float("nan")}, "fake.itl_ms"),
    ({"tokens": "many"}, "fake.tokens"), ("cut", "fake"),
])
def test_bad_options_name_their_path(fake, where):
    with pytest.raises(ValueError, match=where.replace(".", r"\.")):
        parse_options({}, fake)
