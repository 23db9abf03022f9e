"""The fault matrix of benchmarks/chaos.py, short: every scenario, every request recorded
right, none hung, nothing leaked (the full 10,000-request run is a benchmark).

The providers get 4 s to headers and first token (the benchmark: 1 s), so that a stall of the
shared CI machine does not time out healthy requests and add retries to their records."""
from __future__ import annotations

from benchmarks.chaos import SCENARIOS, passed, run_chaos


async def test_chaos_short():
    result = await run_chaos(requests=15 * len(SCENARIOS), concurrency=50, hang_after=20,
                             first_token_timeout=4.0)
    assert all(row["sent"] == 15 for row in result["scenarios"].values())
    assert result["misrecorded_examples"] == {} and passed(result), result
    # An upstream failure is logged, one line per failed attempt or stream.
    assert result["gateway_log_lines"]["WARNING"] >= 15 * 10
