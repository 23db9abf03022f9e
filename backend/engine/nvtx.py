"""NVTX ranges named ``<prefix>:<stage>`` (schedule, prefill, decode, sample; the server adds
tokenize and detokenize). Disabled ranges cost one attribute lookup: ``range()`` returns a
shared no-op context manager, nothing is formatted or imported.
"""
from __future__ import annotations

import contextlib
from typing import ContextManager

_NOOP = contextlib.nullcontext()


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
        if self._annotate is None:
            return _NOOP
        return self._annotate(f"{self.prefix}:{stage}", domain=self.prefix)
