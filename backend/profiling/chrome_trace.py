"""Read a torch.profiler chrome trace (the JSON that opens in Perfetto) into summary rows.

Standard library only, so any saved trace can be summarised anywhere:
``python -m backend.profiling.report TRACE.json``. Event categories used: ``kernel``,
``gpu_memcpy``, ``gpu_memset`` (CUPTI activities; absent on a CPU run) and
``user_annotation`` (``record_function`` ranges on the CPU). Times are microseconds (float)
in the file, nanoseconds here.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass
from pathlib import Path

from backend.profiling.summary import KERNEL, MEMSET, Activity, Span, build_report, \
    memcpy_kind


@dataclass
class Trace:
    activities: list[Activity]
    spans: list[Span]


def parse(doc: dict | list) -> Trace:
    events = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    activities: list[Activity] = []
    spans: list[Span] = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat = e.get("cat", "")
        start = float(e["ts"]) * 1e3
        end = start + float(e["dur"]) * 1e3
        name = str(e.get("name", ""))
        if cat == "user_annotation":
            spans.append(Span(name, start, end, str(e.get("tid", ""))))
            continue
        if cat == "kernel":
            kind = KERNEL
        elif cat == "gpu_memcpy":
            kind = memcpy_kind(name)
        elif cat == "gpu_memset":
            kind = MEMSET
        else:
            continue
        device = (e.get("args") or {}).get("device", e.get("pid", 0))
        activities.append(Activity(kind, name, start, end, str(device)))
    return Trace(activities, spans)


def load(path: str | Path) -> Trace:
    """A trace file; ``.gz`` files (what torch writes for a ``.json.gz`` name) too."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        return parse(json.load(f))


def report_from_trace(path: str | Path, steps: int | None = None,
                      no_gpu_reason: str | None = None) -> dict:
    trace = load(path)
    return build_report(trace.activities, trace.spans, steps,
                        source="torch.profiler" + (" (CUPTI)" if trace.activities else ""),
                        no_gpu_reason=no_gpu_reason)
