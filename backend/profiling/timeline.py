"""A PNG timeline of a few steps of a trace: the step thread's ranges above, the GPU's
kernels and copies below, idle GPU time shaded. A picture of what Perfetto shows, for docs
and reports (matplotlib, Agg: no display needed).

    python -m backend.profiling.timeline TRACE.json OUT.png [--steps 3] [--skip 1]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless
import matplotlib.pyplot as plt  # noqa: E402 - after the backend is chosen

from backend.profiling.chrome_trace import Trace, load  # noqa: E402
from backend.profiling.summary import KERNEL, STEP_RANGE, merge, \
    step_thread_spans  # noqa: E402

_COLORS = {"engine_step": "#dddddd", "schedule": "#fd8d3c", "prepare": "#fdd0a2",
           "forward": "#9ecae1", "decode": "#c6dbef", "prefill": "#c6dbef",
           "attention": "#6baed6", "sample": "#74c476", "detokenize": "#bcbddc"}
_DEPTH = {"engine_step": 0, "decode": 1, "prefill": 1, "schedule": 1, "prepare": 2,
          "forward": 2, "sample": 1, "attention": 3}


def draw(trace: Trace, out: str | Path, steps: int = 3, skip: int = 1,
         title: str = "") -> Path:
    spans = step_thread_spans(trace.spans)
    marks = sorted((s for s in spans if s.name == STEP_RANGE), key=lambda s: s.start_ns)
    chosen = marks[skip:skip + steps] or marks[:steps]
    if chosen:
        t0, t1 = chosen[0].start_ns, chosen[-1].end_ns
    else:
        t0 = min((a.start_ns for a in trace.activities), default=0.0)
        t1 = max((a.end_ns for a in trace.activities), default=1.0)
    t1 += (t1 - t0) * 0.02  # the last step's trailing GPU work
    us = lambda t: (t - t0) / 1e3  # noqa: E731
    fig, ax = plt.subplots(figsize=(12, 3.8))
    for s in spans:
        if s.end_ns < t0 or s.start_ns > t1 or s.name not in _DEPTH:
            continue
        y = 5 - _DEPTH[s.name]
        ax.barh(y, (s.end_ns - s.start_ns) / 1e3, left=us(s.start_ns), height=0.8,
                color=_COLORS.get(s.name, "#cccccc"), edgecolor="black", linewidth=0.3)
        if (s.end_ns - s.start_ns) > (t1 - t0) * 0.04:
            ax.text(us(s.start_ns) + 1, y, s.name, va="center", fontsize=7)
    acts = [a for a in trace.activities if a.end_ns > t0 and a.start_ns < t1]
    for a in acts:
        ax.barh(1, (a.end_ns - a.start_ns) / 1e3, left=us(a.start_ns), height=0.8,
                color="#3182bd" if a.kind == KERNEL else "#e6550d", linewidth=0)
    busy = merge((a.start_ns, a.end_ns) for a in acts)
    for (_, e0), (s1, _) in zip(busy, busy[1:]):
        ax.axvspan(us(e0), us(s1), ymin=0.0, ymax=0.3, color="red", alpha=0.25, linewidth=0)
    ax.set_yticks([1, 2, 3, 4, 5], ["GPU kernels\n(copies orange)", "attention", "forward /\nprepare",
                                    "stage", "step"])
    ax.set_xlim(0, us(t1))
    ax.set_xlabel("time (us); red: GPU idle")
    ax.set_title(title or f"{len(chosen)} engine step(s)")
    fig.tight_layout()
    out = Path(out)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace")
    p.add_argument("out")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--skip", type=int, default=1, help="steps to skip at the start")
    p.add_argument("--title", default="")
    a = p.parse_args(argv)
    print(draw(load(a.trace), a.out, a.steps, a.skip, a.title))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
