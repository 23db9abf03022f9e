"""From how many rows a quantised layer on CUDA multiplies by its kept dense copy instead of
its codes, measured at start on the GPU that runs it.

Where a quantised layer keeps a dense copy of its weight (``linear.keep_prefill_dense``), a
step of M rows can run either the dequantising kernel on the codes (fewer bytes, more work a
byte) or the dense matmul on the copy (bf16's own kernel). Which is faster at a given M
depends on the card and the layer's shape: on an H100 the int4 codes of Llama-2-7B won at 64
rows, on an H200 the dense weights did (docs/BENCHMARKS.md). So with ``--gpu-copy-min-rows
auto`` the engine times both for each shape at a few row counts before its decode graphs are
captured, and each layer takes the smallest row count from which the copy wins at every
larger one. Without it every layer keeps the fixed crossover (``linear.GPU_COPY_MIN_ROWS``):
on an H100 the timed choice made the step 1.5-5.4 % slower than 65 rows at 32-128 rows, so
it stays opt-in (docs/BENCHMARKS.md "The dense copies' row threshold timed at start").

Each path is timed over all the layers of one shape in turn (a model's 32 blocks), so their
weights pass through the L2 cache as they do in a step, not from it.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from backend.layers.fused_ops import StepOps
from backend.layers.gemv import Prologue
from backend.layers.linear import TRITON_MAX_M, Linear, kept_copies, matmul

# Row counts timed: the decode batches the CUDA graphs hold sit among them, and past the
# last one the codes run a dequantising pass and cuBLAS, which the copy always beats.
CANDIDATE_ROWS = (16, 24, 32, 48, 64, 96, TRITON_MAX_M)
NEVER = TRITON_MAX_M + 1  # the copy only where the codes' own kernels stop
# The copy must win by this share to be taken: below it the two are within run-to-run noise
# and the codes keep the memory traffic smaller.
MARGIN = 0.02
REPS = 5

# timer(fn) -> seconds one call of fn takes on the layers' device
Timer = Callable[[Callable[[], None]], float]


@dataclass(frozen=True)
class CopyRows:
    """What ``choose`` decided (``/health``): per layer shape, the first row count served by
    the copy and the µs a layer the two paths took at each row count timed."""
    mode: str  # measured | fixed | none
    rows: dict[str, int]  # shape -> rows from which the copy runs (NEVER: only past the kernels)
    us: dict[str, dict[int, tuple[float, float]]]  # shape -> rows -> (codes, copy) µs a layer
    seconds: float  # time the measurement took
    reason: str

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def shape_key(layer: Linear) -> str:
    """The layers that share a crossover: same kernel, same weight shape."""
    n, k = layer.weight_shape
    return f"{layer.kernel} {n}x{k}"


def crossover(us: dict[int, tuple[float, float]], margin: float = MARGIN) -> int:
    """The smallest timed row count from which the copy beat the codes by ``margin`` at
    every larger one; ``NEVER`` where it lost at the largest."""
    first = NEVER
    for rows in sorted(us, reverse=True):
        codes, copy = us[rows]
        if copy >= codes * (1 - margin):
            break
        first = rows
    return first


def cuda_timer(fn: Callable[[], None]) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3


def _time_paths(group: list[Linear], rows: int, ops: StepOps,
                timer: Timer, reps: int) -> tuple[float, float]:
    """(codes, copy) seconds a layer at ``rows`` rows, medians of ``reps`` alternating runs."""
    x = torch.randn(rows, group[0].in_features, device=group[0].device, dtype=group[0].dtype)

    def run(min_rows: int) -> float:
        for layer in group:
            layer.gpu_copy_min_rows = min_rows
        # as a step runs the layer (``linear.matmul``), its prologue left out
        return timer(lambda: [matmul(layer, x, Prologue(), ops) for layer in group])

    run(NEVER), run(0)  # warm: compile either path's kernels for this row count
    codes, copy = [], []
    for _ in range(reps):
        codes.append(run(NEVER))
        copy.append(run(0))
    n = len(group)
    return statistics.median(codes) / n, statistics.median(copy) / n


def choose(layers: Iterable[torch.nn.Module], min_rows: int | str | None,
           ops: StepOps, timer: Timer = cuda_timer,
           candidates: tuple[int, ...] = CANDIDATE_ROWS, reps: int = REPS) -> CopyRows:
    """Set ``gpu_copy_min_rows`` on every quantised layer that keeps a dense copy: to
    ``min_rows`` where it is a number, measured per layer shape (``timer``) where it is
    "auto"; None keeps each layer's fixed crossover (``linear.GPU_COPY_MIN_ROWS``)."""
    kept = kept_copies(layers)
    if not kept:
        return CopyRows("none", {}, {}, 0.0, "no layer keeps a dense copy")
    groups: dict[str, list[Linear]] = defaultdict(list)
    for m in kept:
        groups[shape_key(m)].append(m)
    if min_rows != "auto":
        for m in kept:
            if min_rows is not None:
                m.gpu_copy_min_rows = min_rows
        return CopyRows("fixed", {key: group[0].gpu_copy_min_rows for key, group in groups.items()},
                        {}, 0.0, "the default crossover" if min_rows is None
                        else f"set: copies from {min_rows} rows")
    t0 = time.perf_counter()
    rows, us = {}, {}
    with torch.inference_mode():
        for key, group in groups.items():
            us[key] = {m: tuple(round(t * 1e6, 2) for t in
                                _time_paths(group, m, ops, timer, reps))
                       for m in candidates}
            rows[key] = crossover(us[key])
            for layer in group:
                layer.gpu_copy_min_rows = rows[key]
    return CopyRows("measured", rows, us, round(time.perf_counter() - t0, 3),
                    f"timed at {', '.join(map(str, candidates))} rows, "
                    f"{reps} runs of each path over a shape's layers")
