"""The accuracy benchmark's arithmetic: errors vs injected and vs the fake's actual send."""
from __future__ import annotations

import json

import pytest

from benchmarks.loadgen_accuracy import _reference_sample, read_stamps, reference_errors, wire_errors
from loadtests.sse import RequestRecord


def test_reference_sample_splits_fake_lateness_from_delivery():
    event = {"choices": [{"index": 0, "delta": {"content": "t0 "}, "finish_reason": None}],
             "fake_recv_ns": 1000000, "fake_sent_ns": 101300000}
    t0, t1 = 500_000, 101_500_000  # client: sent at 0.5 ms, first content at 101.5 ms
    s = _reference_sample(event, t0, t1, ttft_ms=100)
    assert s["injected"] == pytest.approx(1.0)
    assert s["vs_sent"] == pytest.approx(0.2)  # 101.5 - 101.3
    assert s["fake_late"] == pytest.approx(0.3)  # 101.3 - 1.0 - 100
    assert set(_reference_sample({"choices": event["choices"]}, t0, t1, 100)) == {"injected"}


def test_reference_client_reads_the_first_content_event(lt_fake):
    """The raw-socket reference frames the chunked SSE body and stops at the first content
    event (the role-only chunk before it does not count), with the fake's stamps."""
    url, _ = lt_fake(ttft_ms=50, itl_ms=200, tokens=3)
    (sample,) = reference_errors(url, 1, ttft_ms=50, tokens=3)
    assert 0 <= sample["injected"] < 150  # stopped at the first token, not the second
    assert 0 <= sample["vs_sent"] < 150 and "fake_late" in sample


def test_wire_errors_match_records_to_stamp_log(tmp_path):
    log = tmp_path / "stamps.jsonl"
    base = 1_700_000_000_000_000_000
    log.write_text(json.dumps({"request_id": "a", "recv_ns": 10, "first_sent_ns": 100_000_010,
                               "recv_unix_ns": base, "first_sent_unix_ns": base + 100_400_000})
                   + "\n")
    rec = RequestRecord(request_id="a", model="m", t_start_unix=base / 1e9, ttft_s=0.1006, ok=True)
    other = RequestRecord(request_id="b", model="m", ttft_s=0.1, ok=True)  # not in the log
    out = wire_errors([rec, other], read_stamps(str(log)), ttft_ms=100)
    assert out["error_vs_sent_ms"]["count"] == 1
    assert out["error_vs_sent_ms"]["p50"] == pytest.approx(0.2, abs=1e-3)
    assert out["fake_late_from_client_start_ms"]["p50"] == pytest.approx(0.4, abs=1e-3)
    assert out["fake_late_from_fake_receipt_ms"]["p50"] == pytest.approx(0.0, abs=1e-6)
    assert read_stamps(str(tmp_path / "missing.jsonl")) == {}
