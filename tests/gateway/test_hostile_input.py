"""Malformed input is a 4xx OpenAI-style error, never a 5xx, with or without a valid key; the
request log (JSONL and CSV) stays writable and readable whatever the request held."""
from __future__ import annotations

import csv
import gzip
import json

import pytest
from yarl import URL

from benchmarks.rawhttp import exchange, request_bytes
from gateway.record import LOG_FIELDS, MAX_FIELD_CHARS, TRUNCATED, RequestLog
from tests.gateway.conftest import CLIENT_KEY, Gateway

OK = {"model": "fast", "messages": [{"role": "user", "content": "hi"}]}


def _with(raw_field: str) -> bytes:
    """OK with one more field whose JSON text is written as is."""
    return json.dumps(OK).encode()[:-1] + b', ' + raw_field.encode() + b"}"


BODIES = {
    "deep_array": b"[" * 100_000 + b"]" * 100_000,
    "deep_field": _with('"x": ' + "[" * 5000 + "]" * 5000),
    "deep_65": _with('"x": ' + "[" * 65 + "]" * 65),
    "digits_5000": _with('"seed": ' + "9" * 5000),
    "int64_over": _with('"seed": 9223372036854775808'),
    "int64_under": _with('"top_k": -9223372036854775809'),
    "u64": _with('"max_tokens": 18446744073709551616'),
    "nan": _with('"temperature": NaN'),
    "infinity": _with('"temperature": Infinity'),
    "minus_infinity": _with('"top_p": -Infinity'),
    "float_overflow": _with('"temperature": 1e999'),
    "surrogate_content": b'{"model": "fast", "messages": [{"role": "user", "content": "a\\ud800b"}]}',
    "surrogate_model": b'{"model": "fa\\udfffst", "messages": [{"role": "user", "content": "x"}]}',
    "surrogate_key": b'{"model": "fast", "\\ud800": 1, "messages": [{"role": "user"}]}',
    "not_utf8": b'{"model": "fast\xff\xfe", "messages": []}',
    "not_json": b"{nope",
    "empty": b"",
    "array": b"[1, 2]",
    "huge_model": json.dumps({**OK, "model": "m" * 1_000_000}).encode(),
}


@pytest.mark.parametrize("authed", [True, False], ids=["authed", "anonymous"])
@pytest.mark.parametrize("name", sorted(BODIES))
async def test_malformed_body_is_4xx(gw: Gateway, name: str, authed: bool):
    url = URL(gw.url)
    headers = {"Content-Type": "application/json"}
    if authed:
        headers["Authorization"] = f"Bearer {CLIENT_KEY}"
    r = await exchange(url.host, url.port,
                       request_bytes("/v1/chat/completions", BODIES[name], headers))
    assert 400 <= r.status < 500, (r.status, r.body[:200])
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert r.status == (400 if authed else 401)  # the key is checked first
    assert gw.fake.stats.requests == 0


@pytest.mark.parametrize("name", ["nan", "int64_over", "surrogate_content", "deep_field"])
async def test_error_names_field(gw: Gateway, name: str):
    url = URL(gw.url)
    r = await exchange(url.host, url.port, request_bytes(
        "/v1/chat/completions", BODIES[name],
        {"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json"}))
    err = r.json()["error"]
    assert r.status == 400
    want = {"nan": None, "int64_over": "seed", "surrogate_content": "messages",
            "deep_field": None}[name]
    assert err["param"] == want, err


async def test_gzip_label_on_plain_body(gw: Gateway):
    url = URL(gw.url)
    headers = {"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json",
               "Content-Encoding": "gzip"}
    r = await exchange(url.host, url.port,
                       request_bytes("/v1/chat/completions", json.dumps(OK).encode(), headers))
    assert r.status == 400 and r.json()["error"]["code"] == "bad_content_encoding"
    # A body that really is gzip still works.
    r = await exchange(url.host, url.port, request_bytes(
        "/v1/chat/completions", gzip.compress(json.dumps({**OK, "fake": {"ttft_ms": 0}})
                                              .encode()), headers))
    assert r.status == 200


async def test_request_log_bounded_and_csv_readable(make_gateway, tmp_path):
    csv_path = tmp_path / "requests.csv"
    gw = await make_gateway(request_log_csv=str(csv_path))
    url = URL(gw.url)
    auth = {"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json"}
    n = 0
    for name in ("huge_model", "surrogate_model", "surrogate_content", "nan"):
        await exchange(url.host, url.port,
                       request_bytes("/v1/chat/completions", BODIES[name], auth))
        n += 1
    # A model name of 256 characters passes validation: 404, logged bounded.
    long_name = "é" * 256
    await exchange(url.host, url.port, request_bytes(
        "/v1/chat/completions", json.dumps({**OK, "model": long_name}).encode(), auth))
    n += 1
    rows = await gw.wait_rows(n)
    assert len(rows) == n and {r["status"] for r in rows} <= {400, 404, 413}
    for line in gw.log_path.read_text().splitlines():
        assert len(line) < 32 * MAX_FIELD_CHARS  # was 2 MB for a 1 MB model name
    with open(csv_path, newline="", encoding="utf-8") as f:
        back = list(csv.DictReader(f))
    assert len(back) == n
    assert all(len(v) <= MAX_FIELD_CHARS for row in back for v in row.values())



def test_request_log_truncates_with_marker(tmp_path):
    log = RequestLog(str(tmp_path / "r.jsonl"), str(tmp_path / "r.csv"))
    log.write({**{k: None for k in LOG_FIELDS}, "model": "m" * 1_000_000,
               "error": "upstream: \udc80" + "x" * 10})
    log.flush()
    with open(tmp_path / "r.csv", newline="", encoding="utf-8") as f:
        (row,) = list(csv.DictReader(f))
    assert len(row["model"]) == MAX_FIELD_CHARS and row["model"].endswith(TRUNCATED)
    assert row["error"] == "upstream: \\udc80" + "x" * 10
    (line,) = (tmp_path / "r.jsonl").read_text().splitlines()
    assert json.loads(line)["model"] == row["model"]
