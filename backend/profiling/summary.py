"""Three numbers of where GPU time goes, judged against thresholds, with a plain verdict.

Input-agnostic and standard library only: ``chrome_trace`` (torch.profiler traces) and
``deploy/nsight/summarize.py`` (``nsys stats`` CSVs) turn what they read into GPU
``Activity`` rows and CPU ``Span`` ranges, and ``build_report`` computes one report from them:

* kernel gap ratio = GPU idle time / window (first GPU activity's start to the last one's end,
  per device; busy = the union of kernel, copy and memset intervals, so overlapping streams
  are not double counted) -- healthy < 5%; each idle gap is attributed to the innermost CPU
  range the step thread was in while the GPU waited, so the verdict can name its owner;
* memcpy share = (HtoD + DtoH copy time) / (kernel + all memory-operation time) -- < 3%;
* kernels per step (report only; many launches under 10 us point at launch overhead);
* kernel-busy (``kernel_busy_pct``) = the time the GPU ran something inside the counted steps'
  wall span / that span: unlike the gap ratio, GPU idle before the first activity or after
  the last one counts, so a host that starves the GPU at a capture's edges shows;
* top kernels by time and the time per named range.
"""
from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass
from typing import Iterable

# Thresholds (their source is cited in docs/PROFILING.md).
GAP_RATIO_MAX = 0.05
MEMCPY_SHARE_MAX = 0.03
SHORT_KERNEL_NS = 10_000  # launch overhead (a few us) dominates kernels shorter than this
TOP_KERNELS = 10
STEP_RANGE = "engine_step"  # the range that marks one engine step (backend.profiling.ranges)
OUTSIDE = "(between steps)"  # gap time while the step thread was in no range at all
UNNAMED = "(step, outside named ranges)"

KERNEL = "kernel"
HTOD, DTOH, MEMCPY_OTHER, MEMSET = "memcpy_htod", "memcpy_dtoh", "memcpy_other", "memset"


@dataclass(frozen=True)
class Activity:
    """One GPU activity: a kernel, a copy or a memset."""
    kind: str  # KERNEL, HTOD, DTOH, MEMCPY_OTHER or MEMSET
    name: str
    start_ns: float
    end_ns: float
    device: str = "0"


@dataclass(frozen=True)
class Span:
    """One CPU range (record_function / NVTX push-pop) on one thread."""
    name: str
    start_ns: float
    end_ns: float
    thread: str = ""


@dataclass
class Check:
    name: str
    value: float | None
    threshold: str
    passed: bool | None  # None = not measurable from the input, or report only
    unit: str = "pct"  # "ratio" (0..1, shown as %), "pct" (already percent), "count"


def memcpy_kind(name: str) -> str:
    """HTOD / DTOH / MEMCPY_OTHER from a copy's name in any tool's spelling: nsys
    "[CUDA memcpy Host-to-Device]" or "[CUDA memcpy HtoD]", torch "Memcpy HtoD (Pinned ->
    Device)"."""
    low = name.lower()
    if "host-to-device" in low or "htod" in low:
        return HTOD
    if "device-to-host" in low or "dtoh" in low:
        return DTOH
    return MEMCPY_OTHER


# --- the numbers ----------------------------------------------------------------------------

def merge(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of intervals, sorted, non-overlapping."""
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def gap_stats(activities: list[Activity]) -> dict:
    """window_ns, idle_ns, gap_ratio, devices and the idle gaps [(start, end)] of every device."""
    per_device: dict[str, list[tuple[float, float]]] = {}
    for a in activities:
        per_device.setdefault(a.device, []).append((a.start_ns, a.end_ns))
    window = idle = 0.0
    gaps: list[tuple[float, float]] = []
    for spans in per_device.values():
        busy = merge(spans)
        window += busy[-1][1] - busy[0][0]
        for (_, e0), (s1, _) in zip(busy, busy[1:]):
            gaps.append((e0, s1))
            idle += s1 - e0
    return {"window_ns": window, "idle_ns": idle,
            "gap_ratio": idle / window if window else None,
            "devices": len(per_device), "gaps": gaps}


def memcpy_share(kernel_ns: float, memop_ns: float, htod_ns: float, dtoh_ns: float
                 ) -> float | None:
    gpu = kernel_ns + memop_ns
    return (htod_ns + dtoh_ns) / gpu if gpu else None


def attribute_gaps(gaps: list[tuple[float, float]], spans: list[Span]) -> dict[str, float]:
    """Idle ns per innermost range of ``spans`` (one thread's, so properly nested) covering
    each piece of each gap; pieces outside every range go to OUTSIDE."""
    ordered = sorted(spans, key=lambda s: (s.start_ns, -s.end_ns))
    starts = [s.start_ns for s in ordered]
    longest = max((s.end_ns - s.start_ns for s in ordered), default=0.0)
    owners: dict[str, float] = {}
    for gs, ge in gaps:
        if ge <= gs:
            continue
        # every span overlapping [gs, ge) starts after gs - longest and before ge
        lo = bisect.bisect_left(starts, gs - longest)
        hi = bisect.bisect_left(starts, ge)
        cands = [s for s in ordered[lo:hi] if s.end_ns > gs]
        cuts = sorted({gs, ge, *(t for s in cands for t in (s.start_ns, s.end_ns)
                                 if gs < t < ge)})
        for a, b in zip(cuts, cuts[1:]):
            mid = (a + b) / 2
            inner = None
            for s in cands:  # innermost = the latest start among those covering mid
                if s.start_ns <= mid < s.end_ns and (inner is None or s.start_ns >= inner.start_ns):
                    inner = s
            name = OUTSIDE if inner is None else (UNNAMED if inner.name == STEP_RANGE
                                                   else inner.name)
            owners[name] = owners.get(name, 0.0) + (b - a)
    return owners


def top_kernels(activities: list[Activity], n: int = TOP_KERNELS) -> list[dict]:
    by_name: dict[str, list[float]] = {}
    total = 0.0
    for a in activities:
        if a.kind == KERNEL:
            d = a.end_ns - a.start_ns
            by_name.setdefault(a.name, []).append(d)
            total += d
    rows = [{"name": name, "calls": len(ds), "total_ms": sum(ds) / 1e6,
             "mean_us": sum(ds) / len(ds) / 1e3, "share": sum(ds) / total if total else None}
            for name, ds in by_name.items()]
    rows.sort(key=lambda r: r["total_ms"], reverse=True)
    return rows[:n]


def range_table(spans: list[Span], steps: int | None) -> dict[str, dict]:
    """Per range name: calls, total and mean wall time, and time per step."""
    out: dict[str, dict] = {}
    for s in spans:
        r = out.setdefault(s.name, {"calls": 0, "total_ms": 0.0})
        r["calls"] += 1
        r["total_ms"] += (s.end_ns - s.start_ns) / 1e6
    for r in out.values():
        r["mean_ms"] = r["total_ms"] / r["calls"]
        r["per_step_ms"] = r["total_ms"] / steps if steps else None
    return dict(sorted(out.items(), key=lambda kv: kv[1]["total_ms"], reverse=True))


def steps_window(spans: list[Span]) -> tuple[float, float] | None:
    """(first counted step's start, last one's end) in ns; None without step ranges (nsys)."""
    marks = [s for s in spans if s.name == STEP_RANGE]
    if not marks:
        return None
    return min(s.start_ns for s in marks), max(s.end_ns for s in marks)


def clip_to_steps(activities: list[Activity], spans: list[Span]
                  ) -> tuple[list[Activity], list[Span]]:
    """Only what starts inside the counted steps (first step's start .. last step's end):
    what a profiler still records while it stops belongs to later steps, and a lead step's
    ranges are not counted. No step ranges (nsys): unchanged."""
    window = steps_window(spans)
    if window is None:
        return activities, spans
    lo, hi = window
    return ([a for a in activities if lo <= a.start_ns < hi],
            [s for s in spans if lo <= s.start_ns < hi])


def busy_in_window(activities: list[Activity], lo: float, hi: float) -> tuple[float, int]:
    """(ns during which each device ran something inside [lo, hi), summed over devices; the
    number of devices). Activities that straddle an edge count for their part inside: with
    overlap scheduling the first counted step starts while the GPU still runs the step
    before it (recorded thanks to the lead step), and the last step's work runs past its end."""
    per_device: dict[str, list[tuple[float, float]]] = {}
    for a in activities:
        s, e = max(a.start_ns, lo), min(a.end_ns, hi)
        if s < e:
            per_device.setdefault(a.device, []).append((s, e))
    return (sum(e - s for iv in per_device.values() for s, e in merge(iv)),
            len(per_device))


def step_thread_spans(spans: list[Span]) -> list[Span]:
    """The spans of the thread that ran the engine steps (all spans when none is marked)."""
    threads = {s.thread for s in spans if s.name == STEP_RANGE}
    return [s for s in spans if s.thread in threads] if threads else list(spans)


# --- the report -----------------------------------------------------------------------------

def build_report(activities: list[Activity], spans: list[Span], steps: int | None = None,
                 source: str = "torch.profiler", no_gpu_reason: str | None = None) -> dict:
    """One report from GPU activities and CPU ranges. ``steps``: engine steps in the capture
    (default: the number of STEP_RANGE spans). ``no_gpu_reason``: why there is no GPU
    activity (a CPU run), shown where the GPU numbers are null."""
    if steps is None:
        steps = sum(1 for s in spans if s.name == STEP_RANGE) or None
    window = steps_window(spans)
    busy_in_steps = busy_in_window(activities, *window) if window and activities else None
    activities, spans = clip_to_steps(activities, spans)
    reasons: dict[str, str] = {}
    kernels = [a for a in activities if a.kind == KERNEL]
    kernel_ns = sum(a.end_ns - a.start_ns for a in kernels)
    memops = [a for a in activities if a.kind != KERNEL]
    memop_ns = sum(a.end_ns - a.start_ns for a in memops)
    htod_ns = sum(a.end_ns - a.start_ns for a in memops if a.kind == HTOD)
    dtoh_ns = sum(a.end_ns - a.start_ns for a in memops if a.kind == DTOH)
    gaps = gap_stats(activities) if activities else None
    owners: dict[str, float] = {}
    if gaps is None:
        reasons["kernel_gap_ratio"] = reasons["memcpy_share"] = reasons["kernels_per_step"] = \
            no_gpu_reason or "the capture holds no GPU activity"
        gap_ratio = share = per_step = None
    else:
        gap_ratio = gaps["gap_ratio"]
        share = memcpy_share(kernel_ns, memop_ns, htod_ns, dtoh_ns)
        per_step = len(kernels) / steps if steps else None
        if per_step is None:
            reasons["kernels_per_step"] = "the number of steps is unknown (no step ranges)"
        owners = attribute_gaps(gaps["gaps"], step_thread_spans(spans))
    idle = gaps["idle_ns"] if gaps else 0.0
    checks = [
        Check("kernel gap ratio (GPU idle / window)", gap_ratio, "< 5%",
              None if gap_ratio is None else gap_ratio < GAP_RATIO_MAX, "ratio"),
        Check("memcpy HtoD+DtoH share of GPU time", share, "< 3%",
              None if share is None else share < MEMCPY_SHARE_MAX, "ratio"),
        Check("kernels per step", per_step, "report only", None, "count"),
    ]
    report = {
        "source": source,
        "steps": steps,
        "kernel_gap_ratio": gap_ratio,
        "memcpy_share": share,
        "kernels_per_step": per_step,
        "reasons": reasons,
        "window_ms": gaps["window_ns"] / 1e6 if gaps else None,
        "gpu_idle_ms": idle / 1e6 if gaps else None,
        # the counted steps' wall span and, per device, the time the GPU ran something in it
        "steps_window_ms": (window[1] - window[0]) / 1e6 if window else None,
        "gpu_busy_in_steps_ms": busy_in_steps[0] / 1e6 if busy_in_steps else None,
        "gpu_busy_devices": busy_in_steps[1] if busy_in_steps else 0,
        "devices": gaps["devices"] if gaps else 0,
        "kernels": len(kernels),
        "short_kernels": sum(1 for a in kernels if a.end_ns - a.start_ns < SHORT_KERNEL_NS),
        "kernel_ms": kernel_ns / 1e6,
        "memop_ms": memop_ns / 1e6,
        "htod_ms": htod_ns / 1e6,
        "dtoh_ms": dtoh_ns / 1e6,
        "gap_owners": {k: {"idle_ms": v / 1e6, "share": v / idle if idle else None}
                       for k, v in sorted(owners.items(), key=lambda kv: kv[1], reverse=True)},
        "top_kernels": top_kernels(activities),
        "ranges": range_table(spans, steps),
        "checks": [asdict(c) for c in checks],
    }
    report["verdicts"] = verdicts(report)
    return report


def kernel_busy_pct(report: dict) -> tuple[float | None, str | None]:
    """(The time the GPU ran a kernel, copy or memset inside the counted steps' wall span
    (first step's start to last step's end), over that span, in percent; None and why when
    the capture cannot say) of a capture's report."""
    busy, wall_ms = report.get("gpu_busy_in_steps_ms"), report.get("steps_window_ms")
    if busy is None or not wall_ms:
        reasons = dict.fromkeys(report.get("reasons", {}).values())  # each once, in order
        if wall_ms is None and report.get("window_ms") is not None:
            reasons = {"the capture has no engine_step ranges": None}
        return None, "; ".join(reasons) or "empty capture"
    return 100 * busy / (wall_ms * report["gpu_busy_devices"]), None


def verdicts(r: dict) -> list[str]:
    """Plain sentences: what each number says and where to look next."""
    out = []
    gap = r["kernel_gap_ratio"]
    owners = list(r["gap_owners"].items())
    owner = ""
    if owners and owners[0][1]["share"] is not None:
        name, o = owners[0]
        owner = f"; most gap time falls in `{name}` ({o['share']:.0%} of it)"
    if gap is None:
        out.append(f"kernel gap ratio not measured: {r['reasons']['kernel_gap_ratio']}")
    elif gap >= GAP_RATIO_MAX:
        out.append(f"gap problem: the GPU waited {gap:.0%} of the time (healthy < 5%){owner}: "
                   "look at the CPU side of that range and at host syncs")
    else:
        out.append(f"no gap problem: the GPU was idle {gap:.1%} of the time (healthy < 5%)"
                   f"{owner}")
    share = r["memcpy_share"]
    if share is None:
        out.append(f"memcpy share not measured: {r['reasons']['memcpy_share']}")
    elif share >= MEMCPY_SHARE_MAX:
        out.append(f"copy problem: host<->device copies took {share:.1%} of GPU time "
                   "(healthy < 3%): pinned memory, non_blocking copies, fewer round trips")
    else:
        out.append(f"copies fine: host<->device copies took {share:.2%} of GPU time "
                   "(healthy < 3%)")
    per_step = r["kernels_per_step"]
    if per_step is None:
        out.append(f"kernels per step not measured: {r['reasons']['kernels_per_step']}")
    else:
        short = r["short_kernels"] / r["kernels"] if r["kernels"] else 0.0
        line = (f"{per_step:,.0f} kernels per step, {short:.0%} of them shorter than "
                f"{SHORT_KERNEL_NS // 1000} us")
        if short > 0.5 and gap is not None and gap >= GAP_RATIO_MAX:
            line += (": many short kernels while the GPU waits -- launch cost matters unless "
                     "they replay from a CUDA graph; fused kernels cut their number")
        out.append(line)
    return out


def _fmt_value(value: float | None, unit: str) -> str:
    if value is None:
        return "n/a"
    if unit == "ratio":
        return f"{value * 100:.2f}%"
    if unit == "pct":
        return f"{value:.2f}%"
    return f"{value:,.1f}" if value % 1 else f"{value:,.0f}"


def format_check(c: Check | dict) -> str:
    c = c if isinstance(c, dict) else asdict(c)
    verdict = {True: "PASS", False: "FAIL", None: "-"}[c["passed"]]
    note = "no threshold" if c["passed"] is None and c["unit"] == "count" \
        else f"healthy {c['threshold']}"
    return f"  {verdict:4}  {c['name']:<40} {_fmt_value(c['value'], c['unit']):>12}   ({note})"


def render(r: dict) -> str:
    """The text summary of a report."""
    lines = [f"Profile ({r['source']}): {r['steps'] or '?'} step(s)"
             + (f", GPU window {r['window_ms']:.2f} ms" if r["window_ms"] is not None else "")]
    lines.extend(format_check(c) for c in r["checks"])
    lines.append("Verdict")
    lines.extend(f"  - {v}" for v in r["verdicts"])
    if r["gap_owners"]:
        lines.append("GPU idle time by the step thread's range")
        for name, o in r["gap_owners"].items():
            lines.append(f"  {name:<34} {o['idle_ms']:10.3f} ms  {(o['share'] or 0):6.1%}")
    if r["top_kernels"]:
        lines.append("Top kernels by time")
        for k in r["top_kernels"]:
            lines.append(f"  {k['total_ms']:10.3f} ms  {(k['share'] or 0):6.1%}  "
                         f"{k['calls']:6d} x {k['mean_us']:9.1f} us  {k['name'][:80]}")
    if r["ranges"]:
        lines.append("Ranges (CPU wall time)")
        for name, g in r["ranges"].items():
            per_step = f"{g['per_step_ms']:9.3f} ms/step" if g["per_step_ms"] is not None else ""
            lines.append(f"  {name:<20} {g['calls']:6d} calls {g['total_ms']:10.3f} ms  "
                         f"{per_step}")
    return "\n".join(lines)
