"""Named ranges (schedule, prepare, forward, attention, sample, detokenize) for the profiler.

Outside a capture ``stage(name)`` returns a shared no-op context manager after one attribute
lookup, so the hot path pays nothing and torch is not imported here. While a capture runs,
``backend.profiling.capture`` switches the factory to ``torch.profiler.record_function`` and
every range lands in the trace.
"""
from __future__ import annotations

import contextlib
from typing import Callable, ContextManager

STEP_RANGE = "engine_step"  # one per profiled engine step: the trace counts steps by it
# The step a CUDA capture runs before its counted steps: with overlap scheduling the GPU is
# still on that step's work when the first counted step starts, and a profiler records only
# work launched while it runs, so without it that busy time would look idle.
LEAD_RANGE = "engine_step_lead"
STAGES = ("schedule", "prepare", "forward", "attention", "sample", "detokenize")

_NOOP = contextlib.nullcontext()


class _Switch:
    factory: Callable[[str], ContextManager] | None = None


_SWITCH = _Switch()


def stage(name: str) -> ContextManager:
    """A profiler range named ``name`` while a capture runs; a no-op otherwise."""
    factory = _SWITCH.factory
    if factory is None:
        return _NOOP
    return factory(name)


def active() -> bool:
    return _SWITCH.factory is not None


def switch_on(factory: Callable[[str], ContextManager]) -> None:
    """Called by the capture when its profiler starts (``record_function``)."""
    _SWITCH.factory = factory


def switch_off() -> None:
    _SWITCH.factory = None
