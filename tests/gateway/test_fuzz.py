"""Hypothesis over request bodies and headers against the real gateway, short: every answer a
200 or a 4xx OpenAI-style error, never a 5xx or a hang (benchmarks/fuzz_gateway.py runs
1,000+ cases)."""
from __future__ import annotations

from benchmarks.fuzz_gateway import fuzz


def test_fuzz_gateway_short():
    result = fuzz(examples=200)
    assert result["examples"] == 200 and result["5xx"] == 0
    # The cases reach every outcome: served, rejected body, rejected key.
    assert {"200", "400", "401"} <= set(result["statuses"])
    assert result["healthz_after"] == 200 and result["in_flight_after"] == 0
