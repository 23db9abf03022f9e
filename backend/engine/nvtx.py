"""NVTX ranges named ``<prefix>:<stage>`` (schedule, prepare, forward, prefill, decode,
sample; the server adds tokenize and detokenize). Disabled ranges cost two attribute lookups:
``range()`` returns a shared no-op context manager, nothing is formatted or imported. While a
torch.profiler capture runs (``backend.profiling.capture``), every range is also a
``record_function`` range named ``<stage>``, so the capture's trace shows the same stages.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager, Iterator

from backend.profiling import ranges


class NvtxRanges:
    """Factory of NVTX ranges. ``NvtxRanges(enabled=False).range("x")`` is a no-op."""

    def __init__(self, enabled: bool = False, prefix: str = "infer") -> None:
        self.enabled = enabled
        self.prefix = prefix
        self._annotate = None
        if enabled:
            # Imported only when profiling is on: the nvtx package is a no-op without a
            # profiler attached but still costs an import.
            import nvtx

            self._annotate = nvtx.annotate

    def range(self, stage: str) -> ContextManager:
        profiled = ranges.stage(stage)  # the shared no-op outside a capture
        if self._annotate is None:
            return profiled
        nvtx_range = self._annotate(f"{self.prefix}:{stage}", domain=self.prefix)
        if not ranges.active():
            return nvtx_range
        return _both(nvtx_range, profiled)


@contextlib.contextmanager
def _both(outer: ContextManager, inner: ContextManager) -> Iterator[None]:
    with outer, inner:
        yield
