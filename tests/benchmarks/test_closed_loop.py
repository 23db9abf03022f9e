"""benchmarks.closed_loop: GPU-Util is sampled over the measured window only, not over the
profile capture that follows it (its warm-up and export leave the GPU idle)."""
from __future__ import annotations

import time

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
from benchmarks import closed_loop
from loadtests import observe
from tests.backend.profiling.fake_nvml import FakeNvml

INTERVAL_S = 0.01


def test_gpu_util_stops_at_the_windows_end(monkeypatch):
    monkeypatch.setattr(closed_loop, "GpuSampler",
                        lambda interval_s: observe.GpuSampler(INTERVAL_S, nvml=FakeNvml(util=90)))
    order: list[str] = []

    def slow_capture(profiler, step, n, cuda, out_dir):  # an export that keeps the GPU idle
        order.append("capture")
        time.sleep(0.5)
        return {}

    monkeypatch.setattr(closed_loop.ClosedLoop, "_profile", staticmethod(slow_capture))
    engine = LLMEngine(EngineConfig(max_model_len=64, kv_cache_memory_gib=0.01),
                       load_model_source("synthetic:tiny"))
    step = engine.step

    def slow_step():  # steps of a few ms, so the window holds samples
        time.sleep(0.005)
        return step()

    monkeypatch.setattr(engine, "step", slow_step)
    loop = closed_loop.ClosedLoop(engine, closed_loop.seeded_prompts(512, 8, 0),
                                  SamplingParams(max_tokens=8, ignore_eos=True), concurrency=2)
    run = loop.run

    def traced_run(*args, on_window_end=None, **kw):
        def end():
            order.append("window end")
            on_window_end()
        return run(*args, on_window_end=end, **kw)

    monkeypatch.setattr(loop, "run", traced_run)
    res, util = closed_loop.run_with_gpu_util(loop, 2, 4, profile_steps=1)
    assert order == ["window end", "capture"]
    assert util.mean_pct == 90 and util.reason is None
    # no more samples than the window holds: the half second of capture is not in them
    assert res.window_s > 0.05
    assert 0 < util.samples <= res.window_s / INTERVAL_S + 2
