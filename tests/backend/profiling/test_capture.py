"""The profiler path on the CPU build: StepProfiler around real engine steps of the embedded
model, and around a step built of sleeps inside named ranges."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.profiling import chrome_trace, ranges
from backend.profiling.capture import CPU_REASON, TEARDOWN_REASON, CaptureJob, StepProfiler


def capture(prof: StepProfiler, steps: int, out: Path, cuda: bool = False
            ) -> tuple[CaptureJob, list, threading.Event]:
    got: list = []
    done = threading.Event()

    def deliver(result: object) -> None:
        got.append(result)
        done.set()
    job = CaptureJob(steps, out, deliver, cuda=cuda)
    prof.start(job)
    return job, got, done


def test_embedded_model_steps_on_cpu(smollm2_source, tmp_path):
    engine = LLMEngine(EngineConfig(max_model_len=256, kv_cache_memory_gib=0.02),
                       smollm2_source)
    for i in range(2):
        engine.add_request(f"r{i}", [1, 2, 3, 4, 5 + i], SamplingParams(max_tokens=8,
                                                                         ignore_eos=True))
    prof = StepProfiler()
    prof.run_step(engine.step)  # outside the capture: the slowdown's baseline
    _, got, done = capture(prof, 3, tmp_path)
    while engine.has_unfinished():
        prof.run_step(engine.step)
    assert done.wait(60)
    r = got[0]
    assert not isinstance(r, BaseException), r
    assert not ranges.active()  # the ranges are no-ops again once the capture ended
    assert r["steps"] == 3 and r["kernel_gap_ratio"] is None
    assert r["reasons"]["kernel_gap_ratio"] == CPU_REASON
    assert {"engine_step", "schedule", "decode", "prepare", "forward",
            "attention", "sample"} <= set(r["ranges"])
    # smollm2 has 30 layers: one attention range per layer per step
    assert r["ranges"]["attention"]["calls"] == 30 * 3
    c = r["capture"]
    assert c["steps_captured"] == 3 and c["step_ms_outside"] and c["step_ms_during"]
    assert Path(r["trace"]).is_file()


def test_ranges_around_sleeps(tmp_path):
    def step() -> None:
        with ranges.stage("schedule"):
            time.sleep(0.02)
        time.sleep(0.01)  # inside the step, outside any named range
        with ranges.stage("sample"):
            time.sleep(0.005)

    prof = StepProfiler()
    _, got, done = capture(prof, 2, tmp_path)
    for _ in range(3):  # the third step runs outside the capture
        prof.run_step(step)
    assert done.wait(60)
    r = got[0]
    sched, sample, whole = (r["ranges"][k] for k in ("schedule", "sample", "engine_step"))
    assert (sched["calls"], sample["calls"], whole["calls"]) == (2, 2, 2)
    # lower bounds only (sleep never returns early); no upper bound on a shared machine
    assert sched["mean_ms"] >= 20 and sample["mean_ms"] >= 5 and whole["mean_ms"] >= 35
    trace = chrome_trace.load(r["trace"])
    assert sum(s.name == "engine_step" for s in trace.spans) == 2


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # the CPU build: CPU events only
def test_a_cuda_capture_runs_one_lead_step_first(tmp_path):
    """With overlap scheduling the GPU still runs the previous step's work when a counted
    step starts; the lead step launches that work under the profiler. It is not counted:
    its range lies before the counted steps' window."""
    seen: list[int] = []

    def step() -> None:
        seen.append(len(seen))
        with ranges.stage("sample"):
            time.sleep(0.002)

    prof = StepProfiler()
    job, got, done = capture(prof, 2, tmp_path, cuda=True)
    for _ in range(4):  # lead + 2 counted; the fourth runs outside the capture
        prof.run_step(step)
    assert done.wait(60)
    r = got[0]
    assert not isinstance(r, BaseException), r
    assert r["capture"]["lead_steps"] == 1 and r["capture"]["steps_captured"] == 2
    assert r["steps"] == 2 and r["ranges"]["sample"]["calls"] == 2
    assert "engine_step_lead" not in r["ranges"]
    spans = chrome_trace.load(r["trace"]).spans
    lead = [s for s in spans if s.name == "engine_step_lead"]
    counted = [s for s in spans if s.name == "engine_step"]
    assert len(lead) == 1 and len(counted) == 2
    assert lead[0].end_ns <= min(s.start_ns for s in counted)
    assert r["steps_window_ms"] == pytest.approx(
        (max(s.end_ns for s in counted) - min(s.start_ns for s in counted)) / 1e6)
    assert seen == [0, 1, 2, 3]


def test_stop_before_any_step_reports_idle(tmp_path):
    prof = StepProfiler()
    _, got, done = capture(prof, 5, tmp_path)
    assert prof.busy
    prof.stop_early()
    assert done.wait(5) and not prof.busy
    r = got[0]
    assert r["capture"]["steps_captured"] == 0 and r["capture"]["stopped_early"]
    assert "no engine step ran" in r["reasons"]["kernel_gap_ratio"]


def test_a_second_start_while_busy_is_refused(tmp_path):
    prof = StepProfiler()
    capture(prof, 5, tmp_path)
    _, got, done = capture(prof, 5, tmp_path)
    assert done.wait(1) and isinstance(got[0], RuntimeError)
    prof.stop_early()


@pytest.mark.filterwarnings("ignore:CUDA is not available")  # the CPU build: CPU events only
@pytest.mark.parametrize("env, told", [(None, False), ("0", False), ("1", True)])
def test_a_cuda_capture_without_gpu_activity_names_a_cupti_teardown(monkeypatch, tmp_path,
                                                                    env, told):
    monkeypatch.delenv("TEARDOWN_CUPTI", raising=False)
    if env is not None:
        monkeypatch.setenv("TEARDOWN_CUPTI", env)
    prof = StepProfiler()
    _, got, done = capture(prof, 1, tmp_path, cuda=True)
    for _ in range(2):  # the lead step and the counted one
        prof.run_step(lambda: time.sleep(0.001))
    assert done.wait(60)
    reason = got[0]["reasons"]["kernel_gap_ratio"]
    assert (reason == TEARDOWN_REASON) is told
    assert "no GPU activity" in reason
