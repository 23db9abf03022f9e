"""A closed-loop load driven in-process through LLMEngine: ``concurrency`` clients, each
sending its next request the moment its previous one finishes.

The first ``warmup`` requests are warm-up; the next ``measured`` are recorded. Clients keep
sending past them (those requests are not recorded) so the load stays at ``concurrency``
until the last measured request ends; then everything still in flight is aborted. TTFT runs
from ``add_request`` to the end of the step that returned the request's first token, TPOT is
(t_last - t_first) / (tokens - 1) per request, output tok/s counts every token the engine
produced between the first measured send and the last measured finish.
"""
from __future__ import annotations

import itertools
import random
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import StepStats
from backend.engine.sampling import SamplingParams
from backend.profiling.capture import CaptureJob, StepProfiler
from loadtests.observe import GpuSampler


@dataclass
class RequestRecord:
    sent_ns: int
    measured: bool
    first_ns: int | None = None
    last_ns: int | None = None
    tokens: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_ns is None else (self.first_ns - self.sent_ns) / 1e9

    @property
    def tpot_s(self) -> float | None:
        if self.first_ns is None or self.tokens < 2:
            return None
        return (self.last_ns - self.first_ns) / 1e9 / (self.tokens - 1)


@dataclass
class StepSample:
    """One engine step inside the measured window."""
    duration_s: float
    prefill_tokens: int
    decode_tokens: int
    batch_size: int
    context_tokens: int  # tokens of the running sequences before the step (decode steps: the K/V read)
    prefill_seqs: int = 0  # prefill chunks in the step
    graphed: bool | None = None  # a CUDA graph ran it (None: no graphs)


@dataclass
class LoopResult:
    records: list[RequestRecord]  # measured requests only
    window_s: float
    window_tokens: int
    steps: list[StepSample] = field(default_factory=list)
    profile: dict | None = None  # the StepProfiler report of the steps after the window


class _LastStep:
    def __init__(self) -> None:
        self.stats: StepStats | None = None

    def __call__(self, stats: StepStats) -> None:
        self.stats = stats


def seeded_prompts(vocab: int, length: int, seed: int) -> Iterator[list[int]]:
    """An endless, reproducible stream of random prompts (no two share a prefix block, so
    prefix caching cannot turn prefill into a lookup)."""
    rng = random.Random(seed)
    low = min(100, vocab // 2)  # keep clear of the special tokens at the start of the vocab
    while True:
        yield [rng.randrange(low, vocab) for _ in range(length)]


class ClosedLoop:
    def __init__(self, engine: LLMEngine, prompts: Iterator[list[int]], params: SamplingParams,
                 concurrency: int) -> None:
        self.engine = engine
        self.prompts = prompts
        self.params = params
        self.concurrency = concurrency
        self._ids = itertools.count()

    def run(self, warmup: int, measured: int, on_window_start: Callable[[], None] | None = None,
            profile_steps: int = 0, profile_cuda: bool = False, profile_dir: Path | None = None,
            max_steps: int = 1_000_000, on_window_end: Callable[[], None] | None = None
            ) -> LoopResult:
        """``on_window_start`` / ``on_window_end``: called at the first measured send and
        when the last measured request ends, before the ``profile_steps`` capture."""
        engine, last = self.engine, _LastStep()
        engine.step_observer = last
        records: dict[str, RequestRecord] = {}
        in_flight: set[str] = set()
        issued = done = 0
        window_start_ns = tokens_at_start = None
        steps: list[StepSample] = []
        profiler = StepProfiler()

        def send() -> None:
            nonlocal issued, window_start_ns, tokens_at_start
            rid = f"cl-{next(self._ids)}"
            is_measured = warmup <= issued < warmup + measured
            if is_measured and window_start_ns is None:
                if on_window_start is not None:
                    on_window_start()
                tokens_at_start = engine.generation_tokens_total
                window_start_ns = time.perf_counter_ns()
            records[rid] = RequestRecord(time.perf_counter_ns(), is_measured)
            engine.add_request(rid, next(self.prompts), self.params)
            in_flight.add(rid)
            issued += 1

        def step() -> None:
            nonlocal done
            while len(in_flight) < self.concurrency:
                send()
            context = sum(len(s) for s in engine.scheduler.running)
            outputs = profiler.run_step(engine.step)
            now = time.perf_counter_ns()
            if window_start_ns is not None and done < measured and last.stats is not None:
                s = last.stats
                steps.append(StepSample(s.duration_s, s.num_prefill_tokens, s.num_decode_tokens,
                                        s.batch_size, context, s.num_prefill_seqs, s.graphed))
            for o in outputs:
                rec = records[o.request_id]
                if o.new_token_ids:
                    rec.first_ns = rec.first_ns or now
                    rec.last_ns = now
                    rec.tokens += len(o.new_token_ids)
                if o.finished:
                    in_flight.discard(o.request_id)
                    done += rec.measured

        try:
            for _ in range(max_steps):
                if done >= measured:
                    break
                step()
            else:
                raise RuntimeError(f"{measured} measured requests did not finish in {max_steps} steps")
            window_s = (time.perf_counter_ns() - window_start_ns) / 1e9
            window_tokens = engine.generation_tokens_total - tokens_at_start
            if on_window_end is not None:
                on_window_end()
            report = self._profile(profiler, step, profile_steps, profile_cuda, profile_dir) \
                if profile_steps else None
        finally:
            for rid in list(in_flight):
                engine.abort_request(rid)
            engine.step_observer = None
        return LoopResult([r for r in records.values() if r.measured], window_s, window_tokens,
                          steps, report)

    @staticmethod
    def _profile(profiler: StepProfiler, step: Callable[[], None], n: int, cuda: bool,
                 out_dir: Path | None) -> dict:
        """torch.profiler over the next ``n`` steps of the same load."""
        profiler.warm(cuda)
        done = threading.Event()
        box: list = []
        profiler.start(CaptureJob(n, out_dir or Path("runs/ablation"),
                                  lambda r: (box.append(r), done.set()),
                                  name="ablation", cuda=cuda))
        for _ in range(n + 1):  # on CUDA the capture runs one lead step first
            if not profiler.busy:
                break
            step()
        profiler.stop_early()  # no-op when all n steps were captured
        if not done.wait(600):
            raise RuntimeError("the profile export did not finish")
        if isinstance(box[0], BaseException):
            raise box[0]
        return box[0]


@dataclass
class WindowGpuUtil:
    """NVML GPU-Util over a closed loop's measured window."""
    mean_pct: float | None
    samples: int
    reason: str | None  # why there is no mean


def run_with_gpu_util(loop: ClosedLoop, warmup: int, measured: int, **run_kw
                      ) -> tuple[LoopResult, WindowGpuUtil]:
    """``loop.run`` with NVML sampling GPU-Util from the first measured send to the end of
    the last measured request: not over the profile capture after it (its warm-up and export
    leave the GPU idle for seconds)."""
    sampler = GpuSampler(interval_s=0.1)
    stopped: list = []
    try:
        res = loop.run(warmup, measured, on_window_start=sampler.start,
                       on_window_end=lambda: stopped.append(sampler.stop()), **run_kw)
    finally:
        gpu = stopped[0] if stopped else sampler.stop()
    if gpu.available and gpu.util_pct:
        return res, WindowGpuUtil(statistics.fmean(gpu.util_pct), len(gpu.util_pct), None)
    return res, WindowGpuUtil(None, 0, gpu.reason or "no NVML sample in the window")
