"""Profile the next N steps of the engine loop with torch.profiler, in the loop's own thread.

The usual pitfall is a 30-second capture of a live server: requests time out and retry.
A capture here covers a bounded number of engine steps. The profiler starts and stops in the
engine thread between two steps (CUPTI activities on CUDA, CPU activities otherwise); the
trace export and the summary run in a worker thread, so the engine thread pays only the
profiler's start, stop and per-event cost. Each step sits in a ``engine_step`` range, the
engine's stages in their own ranges (``backend.profiling.ranges``), so the report can count
steps and name the range that owns the GPU's idle time.
"""
from __future__ import annotations

import logging
import os
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, TypeVar

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from backend.profiling import ranges
from backend.profiling.chrome_trace import report_from_trace
from backend.profiling.summary import build_report

log = logging.getLogger(__name__)
T = TypeVar("T")
_RECENT_STEPS = 32  # step times kept from outside captures, for the slowdown figure
CPU_REASON = ("the engine runs on the CPU: torch.profiler recorded CPU activities only "
              "(kernel gaps, copies and launches need a CUDA device and CUPTI)")
IDLE_REASON = "no engine step ran during the capture (the engine had no requests)"
# Kineto releases CUPTI at each stop with TEARDOWN_CUPTI=1; on an H100 (torch 2.11, CUDA 13)
# not one capture then recorded a GPU activity, the first of a process included
TEARDOWN_REASON = ("the capture holds no GPU activity, and TEARDOWN_CUPTI=1 is set: with it, "
                   "captures recorded none on an H100 (docs/PROFILING.md)")


@dataclass
class CaptureJob:
    """One capture request. ``deliver`` is called once, from a worker thread (or the engine
    thread when nothing was captured), with the report dict or an exception."""
    steps: int
    out_dir: Path
    deliver: Callable[[dict | BaseException], None]
    name: str = "profile"
    cuda: bool = False  # profile CUDA activities (CUPTI) too
    started_ns: int | None = None
    lead_steps: int = 0  # steps run under the profiler before the counted ones
    step_s: list[float] = field(default_factory=list)
    stop_requested: bool = False


def _new_profiler(cuda: bool) -> tuple[profile, str | None]:
    """A profiler over every thread (so server-side ranges such as detokenize land in the
    trace too) where this torch can; else the engine thread only, with a note why."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    # trace_only: stop() skips building Python event objects (only the exported trace is
    # read), which shortens the stop the engine thread waits for; newer torch only.
    for options in ({"profile_all_threads": True, "trace_only": True},
                    {"profile_all_threads": True}):
        try:
            config = torch._C._profiler._ExperimentalConfig(**options)
        except (AttributeError, TypeError):
            continue
        return profile(activities=activities, experimental_config=config), None
    return profile(activities=activities), \
        "this torch profiles only the engine thread; server-side ranges are missing"


class StepProfiler:
    """Owned by the thread that runs the steps; ``start``/``stop_early`` are called there too
    (the async engine posts them as commands)."""

    def __init__(self) -> None:
        self._job: CaptureJob | None = None
        self._prof: profile | None = None
        self._note: str | None = None
        self._start_ms = 0.0
        self._recent: deque[float] = deque(maxlen=_RECENT_STEPS)

    @property
    def busy(self) -> bool:
        return self._job is not None

    def start(self, job: CaptureJob) -> None:
        """Capture the next ``job.steps`` steps (the profiler starts with the first one)."""
        if self._job is not None:
            job.deliver(RuntimeError("a capture is already running"))
            return
        self._job = job

    def warm(self, cuda: bool) -> None:
        """Start and stop a profiler once: the first start in a process initialises Kineto
        (and CUPTI), seconds that would otherwise stall the first captured step."""
        if self._job is None:
            prof, _ = _new_profiler(cuda)
            prof.start()
            prof.stop()

    def stop_early(self) -> None:
        """End the running capture now (timeout or caller gone); reports what it has."""
        if self._job is not None:
            self._job.stop_requested = True
            self._finish()

    def run_step(self, step: Callable[[], T]) -> T:
        """Run one step, profiled when a capture is on."""
        job = self._job
        if job is None:
            t0 = time.perf_counter()
            try:
                return step()
            finally:
                self._recent.append(time.perf_counter() - t0)
        if self._prof is None:
            self._begin(job)
            if job.cuda:
                job.lead_steps = 1
                with record_function(ranges.LEAD_RANGE):
                    return step()
        t0 = time.perf_counter()
        try:
            with record_function(ranges.STEP_RANGE):
                return step()
        finally:
            job.step_s.append(time.perf_counter() - t0)
            if len(job.step_s) >= job.steps:
                self._finish()

    def _begin(self, job: CaptureJob) -> None:
        t0 = time.perf_counter()
        self._prof, self._note = _new_profiler(job.cuda)
        try:
            self._prof.start()
        except RuntimeError as exc:  # an all-threads profiler this build refuses to start
            log.warning("profiler over all threads failed (%s); engine thread only", exc)
            self._prof = profile(activities=self._prof.activities)
            self._note = f"engine thread only: {exc}"
            self._prof.start()
        ranges.switch_on(record_function)
        job.started_ns = time.time_ns()
        self._start_ms = (time.perf_counter() - t0) * 1e3

    def _finish(self) -> None:
        job, prof, self._job, self._prof = self._job, self._prof, None, None
        ranges.switch_off()
        if prof is None:  # stopped before any step ran
            report = build_report([], [], 0, source="torch.profiler", no_gpu_reason=IDLE_REASON)
            report["capture"] = self._capture_info(job, 0.0)
            job.deliver(report)
            return
        info = self._capture_info(job, 0.0)
        if self._note is None:
            # A profiler over all threads may be stopped from any thread: the worker pays
            # for the stop (CUPTI flush, hundreds of ms on a big model), not the engine. The
            # summary keeps only what lies inside the captured steps.
            info["stopped_in"] = "worker thread"
            threading.Thread(target=_stop_and_export, args=(prof, job, info),
                             name="profile-export", daemon=True).start()
            return
        t0 = time.perf_counter()  # a thread-local profiler stops where it started
        try:
            prof.stop()
        except Exception as exc:  # noqa: BLE001 - the caller gets it; the engine keeps going
            log.exception("profiler stop failed")
            job.deliver(exc)
            return
        info["profiler_stop_ms"] = (time.perf_counter() - t0) * 1e3
        info["stopped_in"] = "engine thread"
        threading.Thread(target=_export, args=(prof, job, info), name="profile-export",
                         daemon=True).start()

    def _capture_info(self, job: CaptureJob, stop_ms: float) -> dict:
        before = statistics.fmean(self._recent) * 1e3 if self._recent else None
        during = statistics.fmean(job.step_s) * 1e3 if job.step_s else None
        return {
            "steps_requested": job.steps,
            "steps_captured": len(job.step_s),
            "lead_steps": job.lead_steps,
            "stopped_early": job.stop_requested,
            "step_ms_outside": before,
            "step_ms_during": during,
            "slowdown": during / before - 1 if before and during else None,
            "profiler_start_ms": self._start_ms if job.step_s else 0.0,
            "profiler_stop_ms": stop_ms,
            "note": self._note,
        }


def trace_path(out_dir: Path, name: str, started_ns: int | None) -> Path:
    stamp = datetime.fromtimestamp((started_ns or time.time_ns()) / 1e9, timezone.utc)
    return out_dir / f"{name}-{stamp.strftime('%Y%m%dT%H%M%S.%fZ')}.json"


def _stop_and_export(prof: profile, job: CaptureJob, info: dict) -> None:
    t0 = time.perf_counter()
    try:
        prof.stop()
    except Exception as exc:  # noqa: BLE001 - handed to the caller
        log.exception("profiler stop failed")
        job.deliver(exc)
        return
    info["profiler_stop_ms"] = (time.perf_counter() - t0) * 1e3
    _export(prof, job, info)


def _no_gpu_reason(cuda: bool) -> str | None:
    """Why a capture may hold no GPU activity, where the cause is known before reading it."""
    if not cuda:
        return CPU_REASON
    return TEARDOWN_REASON if os.environ.get("TEARDOWN_CUPTI") == "1" else None


def _export(prof: profile, job: CaptureJob, info: dict) -> None:
    """Worker thread: write the chrome trace, summarise it, deliver the report."""
    try:
        t0 = time.perf_counter()
        job.out_dir.mkdir(parents=True, exist_ok=True)
        path = trace_path(job.out_dir, job.name, job.started_ns)
        prof.export_chrome_trace(str(path))
        report = report_from_trace(path, steps=len(job.step_s),
                                   no_gpu_reason=_no_gpu_reason(job.cuda))
        info["export_ms"] = (time.perf_counter() - t0) * 1e3
        report["capture"] = info
        report["trace"] = str(path)
    except Exception as exc:  # noqa: BLE001 - handed to the caller
        log.exception("profile export failed")
        job.deliver(exc)
        return
    job.deliver(report)
