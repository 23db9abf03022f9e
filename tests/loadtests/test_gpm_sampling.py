"""The sweep's GPU sampler: GPM metrics beside GPU-Util through a fake NVML, the honest
"unavailable" otherwise, and the chart that puts SM activity next to GPU-Util."""
from __future__ import annotations

import time

import pytest

from loadtests import observe, report
from loadtests.sweep import _gpm_mean
from tests.backend.profiling.fake_nvml import FakeNvml

BUSY = {2: 41.0, 3: 20.0, 5: 12.0, 10: 55.0}


def sample(nv: FakeNvml, wait_for: int = 3) -> dict:
    s = observe.GpuSampler(interval_s=0.01, nvml=nv)
    s.start()
    deadline = time.monotonic() + 10
    while len(s.samples.util_pct) < wait_for and time.monotonic() < deadline:
        time.sleep(0.01)
    return s.stop().summary()


def test_gpm_sampled_beside_gpu_util():
    gpu = sample(FakeNvml([BUSY] * 10_000, util=98.0, gpus=2))
    assert gpu["available"] and gpu["util_pct"]["mean"] == 98.0
    gpm = gpu["gpm"]
    assert gpm["available"] and gpm["sm_active_pct"]["mean"] == pytest.approx(41.0)
    assert gpm["dram_bw_pct"]["mean"] == pytest.approx(55.0) and gpm["tensor_active_pct"]["count"] >= 3
    assert _gpm_mean(gpu, "sm_active_pct") == pytest.approx(41.0)


def test_gpm_unavailable_is_said_not_zeroed():
    gpu = sample(FakeNvml(supported=False))
    assert gpu["available"] and gpu["util_pct"]["mean"] == 98.0  # GPU-Util still sampled
    assert gpu["gpm"] == {"available": False,
                          "reason": "GPM is not supported on GPU 0 (Fake H200)"}
    assert _gpm_mean(gpu, "sm_active_pct") is None
    cpu = sample(FakeNvml(init_error="NVML Shared Library Not Found"), wait_for=0)
    assert not cpu["available"] and "NVML" in cpu["gpm"]["reason"]


def test_chart_shows_sm_activity_or_says_why_not(tmp_path):
    base = {"batch_size": 1, "output_tok_s": 10.0, "tpot_p50_ms": 20.0,
            "gpu_util_mean_pct": 98.0}
    with_gpm = [dict(base, batch_size=b, gpu_sm_active_mean_pct=41.0,
                     gpu_tensor_active_mean_pct=12.0) for b in (1, 2)]
    without = [dict(base, batch_size=b, gpu_sm_active_mean_pct=None,
                    gpu={"gpm": {"available": False, "reason": "GPM is not supported"}})
               for b in (1, 2)]
    for rows, name in ((with_gpm, "a.png"), (without, "b.png")):
        path = report.chart_throughput(rows, str(tmp_path / name))
        assert (tmp_path / name).stat().st_size > 5000, path


def test_loaded_window_leaves_out_start_up_and_drain():
    """The loaded-window figures average only the samples between the first measured send
    and the last measured end; the whole-step mean keeps the idle start-up and drain."""
    from loadtests.sse import RequestRecord
    from loadtests.sweep import _loaded_gpu

    gpu = sample(FakeNvml([BUSY] * 10_000, util=98.0), wait_for=3)
    assert len(gpu["series"]["t_unix"]) == len(gpu["series"]["util_pct"]) >= 3
    t = [100.0 + i for i in range(10)]
    gpu["series"] = {"t_unix": t, "util_pct": [0, 0, 90, 100, 100, 96, 0, 0, 0, 0],
                     "sm_active_pct": [0, 0, 40, 50, 50, 40, 0, 0, 0, 0]}
    ok = [RequestRecord(request_id="a", model="m", t_start_unix=102.0, e2e_s=1.5),
          RequestRecord(request_id="b", model="m", t_start_unix=103.0, e2e_s=2.2)]
    row = _loaded_gpu(ok, gpu)
    assert row["gpu_util_loaded_mean_pct"] == pytest.approx(96.5)  # samples at 102..105
    assert row["gpu_sm_active_loaded_mean_pct"] == pytest.approx(45.0)
    assert row["gpu_loaded_samples"] == 4 and row["gpu_loaded_window_s"] == pytest.approx(3.2)
    assert _loaded_gpu([], gpu)["gpu_util_loaded_mean_pct"] is None
