"""Canary keys through every path (benchmarks/canary.py): well-formed and malformed client
keys in every key header, provider keys echoed behind JSON escapes; no byte of any response,
log record, request-log line or /metrics page may hold one, plain or JSON-escaped."""
from __future__ import annotations

from benchmarks.canary import run_canary


async def test_canaries_leak_nowhere():
    result = await run_canary()
    assert result["hits"] == []
    # The search had something to search: every path answered, logged and recorded.
    assert result["canaries"] == 2 + 3 * 7 * 3 and result["requests"] >= 80
    assert result["request_log_lines"] >= 20 and result["log_records"] >= 10
    assert min(result["bytes_searched"].values()) > 1000
    # The echo faults did carry the provider key: the scrubber had work to do.
    assert result["scrubbed_echoes"] >= 2 and result["provider_saw_only_its_key"]
    assert result["server_errors_without_upstream_fault"] == []
