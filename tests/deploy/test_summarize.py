"""deploy/nsight/summarize.py on CSV fixtures.

The nsys fixtures and ncu_details_handmade.csv are hand-made to the column formats the tools
document (nsys `stats --format csv` reports cuda_gpu_kern_sum, cuda_gpu_mem_time_sum,
cuda_gpu_trace; ncu `--csv --page details`), with numbers chosen so every expected value
below can be worked out by hand. ncu_details_h200_sdpa.csv is a real export: the first two of
ten launches from `ncu --set full` (Nsight Compute 2025.3.1) of deploy/nsight/sdpa_probe.py
on an NVIDIA H200, trimmed by whole rows only.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "nsight" / "summarize.py"
FIX = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(scope="module")
def summarize():
    spec = importlib.util.spec_from_file_location("ft_summarize", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ft_summarize"] = mod  # dataclasses resolve their module by name
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("ft_summarize", None)


def run_cli(*args: str, tmp_path: Path) -> tuple[int, str, dict]:
    out = tmp_path / "summary.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=60)
    doc = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, doc


def checks_by_name(checks: list[dict]) -> dict[str, dict]:
    return {c["name"].split(" (")[0]: c for c in checks}


def test_unhealthy_nsys_numbers_are_exact(tmp_path):
    rc, text, doc = run_cli("--nsys-prefix", str(FIX / "unhealthy"), tmp_path=tmp_path)
    assert rc == 0, text  # not --strict: failures are reported, not fatal
    n = doc["nsys"]
    # Kernels: 70,000 + 13,000 + 4,000 ns over 2 + 2 + 1 launches.
    assert n["kernel_time_ns"] == 87_000 and n["kernel_launches"] == 5 and n["kernel_names"] == 3
    # Memory ops: DtoH 3,000 + HtoD 2,000 + memset 1,000 ns.
    assert (n["htod_ns"], n["dtoh_ns"], n["memop_time_ns"]) == (2_000, 3_000, 6_000)
    assert n["memcpy_share"] == pytest.approx(5_000 / 93_000, rel=1e-12)
    # Trace: window 0..103,000 ns; busy [0,10k] [12k,19k] (two streams overlap) [20k,51k]
    # [60k,103k] = 91,000 ns; idle 12,000 ns.
    assert n["window_ns"] == 103_000 and n["idle_ns"] == 12_000
    assert n["gap_ratio"] == pytest.approx(12_000 / 103_000, rel=1e-12)
    assert (n["trace_kernels"], n["short_kernels"], n["devices"]) == (5, 3, 1)
    c = checks_by_name(n["checks"])
    assert c["memcpy HtoD+DtoH share of GPU time"]["passed"] is False
    assert c["kernel gap ratio"]["passed"] is False
    assert c["kernel launch count"]["value"] == 5 and c["kernel launch count"]["passed"] is None
    assert "FAIL  kernel gap ratio (GPU idle / window)           11.65%" in text
    assert "FAIL  memcpy HtoD+DtoH share of GPU time              5.38%" in text
    assert "kernels shorter than 10 us: 3 of 5" in text


def test_healthy_nsys_in_microseconds_passes_strict(tmp_path):
    rc, text, doc = run_cli("--nsys-prefix", str(FIX / "healthy"), "--strict", tmp_path=tmp_path)
    assert rc == 0, text
    n = doc["nsys"]
    # The `(us)` columns are converted: 799 + 195 us of kernels, 5 us HtoD (legacy "HtoD" name).
    assert n["kernel_time_ns"] == pytest.approx(994_000) and n["kernel_launches"] == 3
    assert n["htod_ns"] == pytest.approx(5_000) and n["dtoh_ns"] == 0
    assert n["memcpy_share"] == pytest.approx(5 / 999, rel=1e-9)
    # Window 2000..3000 us, one 1 us hole between the first two kernels.
    assert n["window_ns"] == pytest.approx(1_000_000) and n["idle_ns"] == pytest.approx(1_000)
    assert n["gap_ratio"] == pytest.approx(0.001, rel=1e-9)
    assert all(c["passed"] in (True, None) for c in n["checks"])


def test_strict_fails_on_a_failed_check(tmp_path):
    rc, _, _ = run_cli("--nsys-prefix", str(FIX / "unhealthy"), "--strict", tmp_path=tmp_path)
    assert rc == 1


def test_handmade_ncu_per_kernel_means_and_bounds(tmp_path):
    rc, text, doc = run_cli("--ncu-csv", str(FIX / "ncu_details_handmade.csv"), tmp_path=tmp_path)
    assert rc == 0, text
    kernels = {k["name"]: k for k in doc["ncu"]}
    paged = kernels["paged_attention_decode_kernel"]
    assert paged["launches"] == 2 and paged["bound"] == "memory"
    m = paged["metrics"]
    # Means of the two launches; the Gbyte/s "Memory Throughput" row is not the percent one.
    assert m["mem_throughput_pct"] == pytest.approx(82.0)
    assert m["sm_util_pct"] == pytest.approx(23.0)
    assert m["l2_hit_pct"] == pytest.approx(36.0)
    assert m["occupancy_pct"] == pytest.approx(60.0)
    assert m["duration_us"] == pytest.approx((1250.0 + 1350.0) / 2)  # usecond and msecond
    c = checks_by_name(paged["checks"])
    assert [c[k]["passed"] for k in ("SM utilisation", "memory throughput", "L2 hit rate",
                                     "achieved occupancy")] == [False, True, False, True]
    assert c["memory throughput"]["threshold"] == "> 80%"  # memory-bound kernel

    flash = kernels["flash_fwd_kernel"]
    assert flash["bound"] == "compute" and flash["launches"] == 1
    f = flash["metrics"]
    # Older ncu names: "Compute (SM) [%]" and "Memory [%]"; "n/a" L2 hit rate; ns duration.
    assert (f["sm_util_pct"], f["mem_throughput_pct"], f["l2_hit_pct"]) == (71.25, 55.0, None)
    assert f["duration_us"] == pytest.approx(95.0)
    c = checks_by_name(flash["checks"])
    assert c["memory throughput"]["threshold"] == "> 50%"
    assert [c[k]["passed"] for k in ("SM utilisation", "memory throughput", "L2 hit rate",
                                     "achieved occupancy")] == [True, True, None, False]


def test_real_h200_ncu_export(summarize):
    (k,) = summarize.ncu_report(FIX / "ncu_details_h200_sdpa.csv")
    assert k.name.startswith("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma")
    assert k.launches == 2 and k.bound == "compute"
    # Launch 0 / launch 1 values, read from the file: 59.29/58.68, 40.58/40.85 (the
    # Speed Of Light percent, not the 961.93 Gbyte/s row), 73.83/74.33, 14.07/14.07,
    # 270.85/269.31 us.
    assert k.metrics["sm_util_pct"] == pytest.approx((59.29 + 58.68) / 2)
    assert k.metrics["mem_throughput_pct"] == pytest.approx((40.58 + 40.85) / 2)
    assert k.metrics["l2_hit_pct"] == pytest.approx((73.83 + 74.33) / 2)
    assert k.metrics["occupancy_pct"] == pytest.approx(14.07)
    assert k.metrics["duration_us"] == pytest.approx((270.85 + 269.31) / 2)
    assert [c.passed for c in k.checks] == [False, False, True, False]


def test_kernel_regex_filters_ncu_kernels(summarize):
    only = summarize.ncu_report(FIX / "ncu_details_handmade.csv", name_filter="flash")
    assert [k.name for k in only] == ["flash_fwd_kernel"]


def test_number_parsing(summarize):
    assert summarize.number("1,234.5") == 1234.5
    assert summarize.number(" 7 ") == 7.0
    for blank in ("", "n/a", "PolicySpread", None):
        assert summarize.number(blank) is None


def test_missing_input_is_a_clear_error(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--nsys-prefix", str(tmp_path / "nope")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no such file" in proc.stderr
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2


def test_a_csv_without_the_expected_table_is_rejected(tmp_path):
    bad = tmp_path / "x_cuda_gpu_kern_sum.csv"
    bad.write_text("SKIPPED: report.sqlite does not contain CUDA kernel data.\n")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--kern-sum", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no CSV header" in proc.stderr


def test_a_capture_without_memory_operations_counts_zero(tmp_path):
    # nsys writes no memory-operation table when nothing was copied; the share is then 0.
    pre = tmp_path / "p"
    for r in ("cuda_gpu_kern_sum", "cuda_gpu_trace"):
        (tmp_path / f"p_{r}.csv").write_text((FIX / f"healthy_{r}.csv").read_text())
    rc, text, doc = run_cli("--nsys-prefix", str(pre), tmp_path=tmp_path)
    assert rc == 0, text
    assert doc["nsys"]["memcpy_share"] == 0.0 and doc["nsys"]["memop_time_ns"] == 0.0
    (tmp_path / "p_cuda_gpu_mem_time_sum.csv").write_text(
        "SKIPPED: p.sqlite does not contain GPU memory data.\n")
    rc, text, doc = run_cli("--nsys-prefix", str(pre), tmp_path=tmp_path)
    assert rc == 0 and doc["nsys"]["memcpy_share"] == 0.0, text


def test_nsys_and_torch_profiler_paths_give_one_report(tmp_path, summarize):
    """The nsys trace, read by summarize.py, and the same activities as a torch.profiler
    chrome trace, read by backend.profiling, give the same numbers and verdicts."""
    rc, text, doc = run_cli("--nsys-prefix", str(FIX / "unhealthy"), "--steps", "2",
                            tmp_path=tmp_path)
    assert rc == 0, text
    rep = doc["report"]
    assert rep["kernel_gap_ratio"] == pytest.approx(doc["nsys"]["gap_ratio"], rel=1e-12)
    assert rep["memcpy_share"] == pytest.approx(doc["nsys"]["memcpy_share"], rel=1e-12)
    assert rep["kernels_per_step"] == 2.5 and rep["source"] == "nsys stats"
    assert rep["verdicts"][0].startswith("gap problem: the GPU waited 12% of the time")
    assert "gap problem" in text
    from backend.profiling import chrome_trace
    kind = {"kernel": "kernel", "memcpy_htod": "gpu_memcpy", "memcpy_dtoh": "gpu_memcpy",
            "memcpy_other": "gpu_memcpy", "memset": "gpu_memset"}
    events = [{"ph": "X", "cat": kind[a.kind], "name": a.name, "ts": a.start_ns / 1e3,
               "dur": (a.end_ns - a.start_ns) / 1e3, "pid": 0, "args": {"device": a.device}}
              for a in summarize.trace_activities(FIX / "unhealthy_cuda_gpu_trace.csv")]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    torch_rep = chrome_trace.report_from_trace(path, steps=2)
    for key in ("kernel_gap_ratio", "memcpy_share", "kernels_per_step", "kernels",
                "short_kernels"):
        assert torch_rep[key] == pytest.approx(rep[key], rel=1e-9), key
    assert torch_rep["verdicts"] == rep["verdicts"]
