"""Named ranges: a shared no-op outside a capture; profiler ranges (and NVTX ranges when
--nvtx is on) while one runs."""
from __future__ import annotations

import contextlib
import sys
import types

from backend.engine.nvtx import NvtxRanges
from backend.profiling import ranges


def test_no_op_outside_a_capture_and_both_inside(monkeypatch):
    log: list = []

    class Annotate:  # stand-in for nvtx.annotate: records push/pop
        def __init__(self, name: str, domain: str) -> None:
            self.name = name

        def __enter__(self) -> None:
            log.append(("push", self.name))

        def __exit__(self, *exc: object) -> None:
            log.append(("pop", self.name))

    @contextlib.contextmanager
    def record(name: str):
        log.append(("range", name))
        yield
        log.append(("end", name))

    monkeypatch.setitem(sys.modules, "nvtx", types.SimpleNamespace(
        annotate=Annotate))
    off = NvtxRanges(False)
    assert off.range("schedule") is ranges.stage("schedule")  # one shared no-op
    on = NvtxRanges(True, "t")
    ranges.switch_on(record)
    try:
        with on.range("schedule"):
            log.append("body")
        with off.range("sample"):
            pass
    finally:
        ranges.switch_off()
    with on.range("decode"):
        pass
    assert log == [("push", "t:schedule"), ("range", "schedule"), "body", ("end", "schedule"),
                   ("pop", "t:schedule"), ("range", "sample"), ("end", "sample"),
                   ("push", "t:decode"), ("pop", "t:decode")]
    assert not ranges.active()
