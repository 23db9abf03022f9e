"""The summary's arithmetic on traces with known gaps, built here (torch.profiler's chrome
trace format: microsecond floats, categories kernel / gpu_memcpy / user_annotation)."""
from __future__ import annotations

import json

import pytest

from backend.profiling import chrome_trace
from backend.profiling.summary import OUTSIDE, UNNAMED, Activity, Span, attribute_gaps, \
    build_report, gap_stats, kernel_busy_pct, render


def x(cat: str, name: str, ts: float, dur: float, **extra) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **extra}


def gpu(cat: str, name: str, ts: float, dur: float, device: int = 0) -> dict:
    return x(cat, name, ts, dur, pid=device, tid=7, args={"device": device})


def cpu(name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return x("user_annotation", name, ts, dur, pid=100, tid=tid)


def two_steps() -> list[dict]:
    """Two engine steps of 500 us on thread 1; the GPU idles 60 us in `schedule` of step 2,
    30 us in `sample` of step 1, and 10 us between the steps. Window 0..1000 us."""
    return [
        cpu("engine_step", 0, 500), cpu("schedule", 0, 20), cpu("forward", 20, 400),
        cpu("attention", 50, 100), cpu("sample", 420, 80),
        cpu("engine_step", 510, 490), cpu("schedule", 510, 100), cpu("forward", 610, 300),
        cpu("sample", 910, 90),
        cpu("detokenize", 400, 50, tid=2),  # another thread: never owns the GPU's gaps
        gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 0, 10),
        gpu("kernel", "gemm_a", 10, 200), gpu("kernel", "attn", 150, 100),  # overlap
        gpu("kernel", "gemm_a", 250, 200),
        # idle 450..480: in `sample` (420..500)
        gpu("kernel", "argmax", 480, 5), gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)",
                                             485, 15),
        # idle 500..510 between the steps; 510..570 in `schedule` (510..610)
        gpu("gpu_memset", "Memset (Device)", 570, 5), gpu("kernel", "gemm_b", 575, 425),
    ]


def test_known_gaps_ratio_owners_and_copies(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": two_steps()}))
    r = chrome_trace.report_from_trace(path)
    assert r["steps"] == 2 and r["devices"] == 1
    assert r["window_ms"] == pytest.approx(1.0)
    assert r["gpu_idle_ms"] == pytest.approx(0.1)  # 30 + 10 + 60 us
    assert r["kernel_gap_ratio"] == pytest.approx(0.1)
    owners = {k: v["idle_ms"] for k, v in r["gap_owners"].items()}
    assert owners == pytest.approx({"schedule": 0.06, "sample": 0.03, OUTSIDE: 0.01})
    assert list(r["gap_owners"])[0] == "schedule"
    # kernels 200 + 100 + 200 + 5 + 425 = 930 us; copies 10 + 15, memset 5
    assert r["kernel_ms"] == pytest.approx(0.93) and r["memop_ms"] == pytest.approx(0.03)
    assert r["memcpy_share"] == pytest.approx(0.025 / 0.96)
    assert r["kernels"] == 5 and r["kernels_per_step"] == 2.5
    assert r["short_kernels"] == 1  # argmax, 5 us
    top = [(k["name"], k["calls"]) for k in r["top_kernels"]]
    assert top == [("gemm_b", 1), ("gemm_a", 2), ("attn", 1), ("argmax", 1)]
    assert r["top_kernels"][1]["share"] == pytest.approx(0.4 / 0.93)
    assert r["ranges"]["schedule"]["total_ms"] == pytest.approx(0.12)
    assert r["ranges"]["schedule"]["per_step_ms"] == pytest.approx(0.06)
    assert r["ranges"]["detokenize"]["calls"] == 1
    checks = {c["name"].split(" (")[0]: c for c in r["checks"]}
    assert checks["kernel gap ratio"]["passed"] is False
    assert checks["memcpy HtoD+DtoH share of GPU time"]["passed"] is True
    assert r["verdicts"][0].startswith("gap problem: the GPU waited 10% of the time")
    assert "`schedule` (60% of it)" in r["verdicts"][0]
    assert "copies fine" in r["verdicts"][1]
    text = render(r)
    assert "FAIL  kernel gap ratio" in text and "gemm_a" in text


def test_healthy_trace_and_copy_problem():
    acts = [Activity("kernel", "k", 0, 1000), Activity("kernel", "k", 1010, 2000),
            Activity("memcpy_htod", "[CUDA memcpy Host-to-Device]", 2000, 2100)]
    r = build_report(acts, [], steps=1)
    assert r["kernel_gap_ratio"] == pytest.approx(10 / 2100)
    assert r["memcpy_share"] == pytest.approx(100 / 2090)
    assert r["verdicts"][0].startswith("no gap problem")
    assert r["verdicts"][1].startswith("copy problem")
    assert r["gap_owners"] == {OUTSIDE: {"idle_ms": pytest.approx(1e-5), "share": 1.0}}


def test_devices_are_measured_separately():
    # two GPUs: each busy half its own window; device 1's idle time does not hide in 0's work
    acts = [Activity("kernel", "a", 0, 50, "0"), Activity("kernel", "a", 100, 150, "0"),
            Activity("kernel", "b", 0, 100, "1"), Activity("kernel", "b", 100, 150, "1")]
    g = gap_stats(acts)
    assert (g["window_ns"], g["idle_ns"], g["devices"]) == (300, 50, 2)


def test_gap_attribution_innermost_range_and_step_body():
    spans = [Span("engine_step", 0, 100), Span("forward", 10, 60), Span("attention", 20, 30)]
    owners = attribute_gaps([(5, 25), (90, 120)], spans)
    assert owners == {UNNAMED: 5 + 10, "forward": 10, "attention": 5, OUTSIDE: 20}


def test_cpu_only_trace_has_null_numbers_with_reasons():
    r = build_report([], [Span("engine_step", 0, 10)], no_gpu_reason="CPU build")
    assert r["kernel_gap_ratio"] is None and r["memcpy_share"] is None
    assert r["kernels_per_step"] is None and r["reasons"]["memcpy_share"] == "CPU build"
    assert "n/a" in render(r)


def test_only_what_starts_inside_the_captured_steps_counts():
    """What the profiler still records while it stops (the next step's kernels, another
    thread's ranges) lies after the last step and is left out."""
    spans = [Span("engine_step", 0, 100, "1"), Span("sample", 90, 100, "1"),
             Span("detokenize", 150, 160, "2")]
    acts = [Activity("kernel", "k", 0, 80), Activity("kernel", "late", 200, 900)]
    r = build_report(acts, spans)
    assert r["kernels"] == 1 and r["window_ms"] == pytest.approx(80 / 1e6)
    assert r["kernel_gap_ratio"] == 0.0 and "detokenize" not in r["ranges"]


def test_kernel_busy_counts_the_steps_edges():
    """Two counted steps span 0..200 ns after a lead step. The lead step's kernel still runs
    when the first counted step starts (overlap scheduling) and the last step's kernel runs
    past the window's end: each counts for its part inside. The GPU idles 30..40, 90..120
    and 180..190: busy 30 + 50 + 60 + 10 = 150 of 200."""
    spans = [Span("engine_step_lead", -100, -5, "1"), Span("engine_step", 0, 100, "1"),
             Span("engine_step", 110, 200, "1")]
    acts = [Activity("kernel", "lead", -50, 30), Activity("kernel", "a", 40, 90),
            Activity("kernel", "b", 120, 180), Activity("kernel", "c", 190, 260)]
    r = build_report(acts, spans)
    assert r["steps"] == 2 and r["steps_window_ms"] == pytest.approx(200 / 1e6)
    assert r["gpu_busy_in_steps_ms"] == pytest.approx(150 / 1e6)
    assert kernel_busy_pct(r) == (pytest.approx(75.0), None)
    # the gap ratio keeps to what starts inside the window: 40..260 with 30 + 10 idle
    assert r["kernels"] == 3 and r["window_ms"] == pytest.approx(220 / 1e6)
    assert r["gpu_idle_ms"] == pytest.approx(40 / 1e6)


def test_kernel_busy_idle_edges_count_and_devices_average():
    """A host that starts the GPU late in the window shows in kernel-busy, not in the gap
    ratio (which starts at the first activity); two devices are averaged."""
    spans = [Span("engine_step", 0, 100, "1")]
    acts = [Activity("kernel", "k", 60, 100, "0"), Activity("kernel", "k", 0, 100, "1")]
    r = build_report(acts, spans)
    assert r["kernel_gap_ratio"] == 0.0 and r["gpu_busy_devices"] == 2
    assert kernel_busy_pct(r) == (pytest.approx(70.0), None)


def test_kernel_busy_needs_step_ranges_and_gpu_work():
    no_steps = build_report([Activity("kernel", "k", 0, 10)], [], steps=1)
    assert kernel_busy_pct(no_steps) == (None, "the capture has no engine_step ranges")
    cpu_only = build_report([], [Span("engine_step", 0, 10)], no_gpu_reason="CPU build")
    assert kernel_busy_pct(cpu_only) == (None, "CPU build")
