"""Print the Nsight numbers that say where GPU time goes, with pass/fail against thresholds.

Reads what the Nsight tools export as CSV (standard library only, so it runs anywhere):

* Nsight Systems: `nsys stats --report cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_trace
  --format csv --output PREFIX REPORT.nsys-rep` writes PREFIX_cuda_gpu_kern_sum.csv,
  PREFIX_cuda_gpu_mem_time_sum.csv and PREFIX_cuda_gpu_trace.csv. From them:
  - kernel gap ratio: GPU idle time / capture window, from the trace (< 5%);
  - memcpy HtoD+DtoH share of GPU time (kernels + memory operations) (< 3%);
  - kernel launch count (and how many launches were shorter than 10 us).
* Nsight Compute: `ncu --import X.ncu-rep --csv --page details > X.csv`. Per kernel (mean over
  its profiled launches): SM utilisation (> 60%), memory throughput (> 50% for a compute-bound
  kernel, > 80% for a memory-bound one), L2 hit rate (> 40%), achieved occupancy (> 50%).

    python deploy/nsight/summarize.py --nsys-prefix runs/nsight/infer_profile \
        --ncu-csv runs/nsight/attention_profile_details.csv [--json out.json] [--strict]

The arithmetic and the verdicts are backend.profiling.summary's, the same code that reports
a torch.profiler capture (python -m backend.profiling.report), so both paths give one report
(JSON key "report"); this script only reads the CSVs. Standard library only.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

# Run as a script from anywhere: the shared summary code lives in the repository's backend.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from backend.profiling.summary import GAP_RATIO_MAX, KERNEL, MEMCPY_OTHER, \
    MEMCPY_SHARE_MAX, MEMSET, SHORT_KERNEL_NS, Activity, Check, build_report, \
    format_check, gap_stats, memcpy_kind, memcpy_share  # noqa: E402

# Per-kernel thresholds (their source is cited in docs/PROFILING.md).
SM_UTIL_MIN = 60.0
MEM_THROUGHPUT_MIN_COMPUTE_BOUND = 50.0
MEM_THROUGHPUT_MIN_MEMORY_BOUND = 80.0
L2_HIT_MIN = 40.0
OCCUPANCY_MIN = 50.0

_UNIT_NS = {"ns": 1.0, "us": 1e3, "μs": 1e3, "ms": 1e6, "s": 1e9}

# ncu's details page: metric names across versions (newest first), all in percent.
_NCU_SM = ("Compute (SM) Throughput", "Compute (SM) [%]", "SM [%]")
_NCU_MEM = ("Memory Throughput", "Memory [%]")
_NCU_L2 = ("L2 Hit Rate",)
_NCU_OCC = ("Achieved Occupancy",)
_NCU_TIME_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                "msecond": 1e3, "s": 1e6, "second": 1e6}


@dataclass
class KernelReport:
    name: str
    launches: int
    bound: str  # "compute" or "memory": whichever SOL throughput is higher
    metrics: dict[str, float | None] = field(default_factory=dict)
    checks: list[Check] = field(default_factory=list)


# --- CSV reading --------------------------------------------------------------------------

def read_table(path: Path, header_key: str) -> list[dict[str, str]]:
    """Rows of the first CSV table whose header line contains `header_key`.

    The tools print progress lines and titles before the table; those are skipped.
    """
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    for i, line in enumerate(lines):
        if header_key in line:
            body = "\n".join(lines[i:])
            return [row for row in csv.DictReader(io.StringIO(body)) if any(row.values())]
    raise ValueError(f"{path}: no CSV header containing {header_key!r}")


def number(text: str | None) -> float | None:
    """'1,234.5' -> 1234.5; '', 'n/a', text -> None. Both tools group thousands with commas."""
    if text is None:
        return None
    cleaned = text.strip().replace(",", "")
    try:
        return float(cleaned)
    except ValueError:  # '', 'n/a', and text values such as ncu's 'PolicySpread'
        return None


def time_column(row: dict[str, str], prefix: str) -> tuple[str, float]:
    """The column named like 'Total Time (ns)' and its factor to nanoseconds."""
    for key in row:
        m = re.fullmatch(re.escape(prefix) + r" \((\w+|μs)\)", key.strip())
        if m and m.group(1) in _UNIT_NS:
            return key, _UNIT_NS[m.group(1)]
    raise ValueError(f"no '{prefix} (unit)' column in {sorted(row)}")


# --- Nsight Systems -----------------------------------------------------------------------

def kernel_summary(path: Path) -> dict[str, float]:
    rows = read_table(path, "Instances")
    if not rows:
        return {"kernel_time_ns": 0.0, "kernel_launches": 0, "kernel_names": 0}
    col, factor = time_column(rows[0], "Total Time")
    total = sum(number(r[col]) or 0.0 for r in rows) * factor
    launches = sum(int(number(r["Instances"]) or 0) for r in rows)
    return {"kernel_time_ns": total, "kernel_launches": launches, "kernel_names": len(rows)}


def memop_summary(path: Path | None) -> dict[str, float]:
    """Copy and memset time. None, or nsys's 'SKIPPED: ... does not contain ... memory ...'
    (a capture with no memory operations), counts as zero."""
    out = {"memop_time_ns": 0.0, "htod_ns": 0.0, "dtoh_ns": 0.0}
    if path is None:
        return out
    text = path.read_text(encoding="utf-8", errors="replace")
    if "Operation" not in text and "SKIPPED" in text:
        return out
    rows = read_table(path, "Operation")
    if not rows:
        return out
    col, factor = time_column(rows[0], "Total Time")
    for r in rows:
        t = (number(r[col]) or 0.0) * factor
        op = r["Operation"].lower()
        out["memop_time_ns"] += t
        kind = memcpy_kind(op)
        if kind != MEMCPY_OTHER and "memcpy" in op:
            out["htod_ns" if kind == "memcpy_htod" else "dtoh_ns"] += t
    return out


def trace_activities(path: Path) -> list[Activity]:
    """Every kernel, copy and memset of cuda_gpu_trace as summary Activities."""
    rows = read_table(path, "Duration (")
    if not rows:
        raise ValueError(f"{path}: the GPU trace has no rows")
    start_col, sf = time_column(rows[0], "Start")
    dur_col, df = time_column(rows[0], "Duration")
    out = []
    for r in rows:
        start, dur = number(r[start_col]), number(r[dur_col])
        if start is None or dur is None:
            continue
        name = r["Name"].strip()
        low = name.lower()
        if not name.startswith("[CUDA "):
            kind = KERNEL
        elif "memset" in low:
            kind = MEMSET
        else:
            kind = memcpy_kind(low)
        out.append(Activity(kind, name, start * sf, start * sf + dur * df,
                            r.get("Device", "") or ""))
    return out


def trace_gaps(path: Path) -> dict[str, float]:
    """Idle time of each device over the capture window, from cuda_gpu_trace
    (backend.profiling.summary.gap_stats: busy = any GPU activity, overlaps merged)."""
    acts = trace_activities(path)
    g = gap_stats(acts)
    kernels = [a for a in acts if a.kind == KERNEL]
    return {"window_ns": g["window_ns"], "idle_ns": g["idle_ns"],
            "gap_ratio": g["gap_ratio"] or 0.0, "trace_kernels": len(kernels),
            "short_kernels": sum(a.end_ns - a.start_ns < SHORT_KERNEL_NS for a in kernels),
            "devices": g["devices"]}


def nsys_report(kern: Path | None, mem: Path | None, trace: Path | None,
                no_memops: bool = False) -> dict:
    """The three numbers: gap ratio, memcpy share, launch count, each with its check.
    `no_memops`: nsys wrote no memory-operation report (none happened); count them as zero."""
    out: dict = {}
    checks: list[Check] = []
    if kern:
        out.update(kernel_summary(kern))
    if mem or no_memops:
        out.update(memop_summary(mem))
    if kern and (mem or no_memops):
        share = memcpy_share(out["kernel_time_ns"], out["memop_time_ns"], out["htod_ns"],
                             out["dtoh_ns"]) or 0.0
        out["memcpy_share"] = share
        checks.append(Check("memcpy HtoD+DtoH share of GPU time", share, "< 3%",
                            share < MEMCPY_SHARE_MAX, "ratio"))
    if trace:
        out.update(trace_gaps(trace))
        checks.append(Check("kernel gap ratio (GPU idle / window)", out["gap_ratio"], "< 5%",
                            out["gap_ratio"] < GAP_RATIO_MAX, "ratio"))
    launches = out.get("kernel_launches", out.get("trace_kernels"))
    if launches is not None:
        checks.append(Check("kernel launch count", float(launches), "report only", None, "count"))
    out["checks"] = checks
    return out


def unified_report(trace: Path, steps: int | None) -> dict:
    """The report a torch.profiler capture gets (three numbers, verdicts, top kernels), from
    cuda_gpu_trace; nsys CSVs hold no CPU ranges, so gaps are not attributed to one."""
    return build_report(trace_activities(trace), [], steps, source="nsys stats")


# --- Nsight Compute -----------------------------------------------------------------------

def _pick(metrics: dict[str, tuple[str, float | None]], names: tuple[str, ...],
          unit: str | None = "%") -> float | None:
    for name in names:
        hit = metrics.get(name)
        if hit is not None and (unit is None or hit[0] == unit):
            return hit[1]
    return None


def ncu_launches(path: Path) -> list[tuple[str, dict[str, tuple[str, float | None]]]]:
    """(kernel name, {metric name: (unit, value)}) per profiled launch, in file order.

    A metric name can appear in two sections with different units ('Memory Throughput' is %
    in Speed Of Light and Gbyte/s in Memory Workload Analysis): the percent one is kept.
    """
    launches: dict[str, tuple[str, dict[str, tuple[str, float | None]]]] = {}
    for r in read_table(path, "Metric Name"):
        name, metrics = launches.setdefault(r["ID"], (r["Kernel Name"], {}))
        key, unit = r["Metric Name"].strip(), (r.get("Metric Unit") or "").strip()
        if key in metrics and metrics[key][0] == "%" and unit != "%":
            continue
        metrics[key] = (unit, number(r["Metric Value"]))
    return list(launches.values())


def _duration_us(metrics: dict[str, tuple[str, float | None]]) -> float | None:
    unit, value = metrics.get("Duration", ("", None))
    factor = _NCU_TIME_US.get(unit)
    return None if value is None or factor is None else value * factor


def _mean(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return sum(got) / len(got) if got else None


def ncu_report(path: Path, name_filter: str | None = None) -> list[KernelReport]:
    by_kernel: dict[str, list[dict[str, tuple[str, float | None]]]] = {}
    for name, metrics in ncu_launches(path):
        if name_filter and not re.search(name_filter, name):
            continue
        by_kernel.setdefault(name, []).append(metrics)
    reports = []
    for name, launches in by_kernel.items():
        m = {
            "sm_util_pct": _mean([_pick(x, _NCU_SM) for x in launches]),
            "mem_throughput_pct": _mean([_pick(x, _NCU_MEM) for x in launches]),
            "l2_hit_pct": _mean([_pick(x, _NCU_L2) for x in launches]),
            "occupancy_pct": _mean([_pick(x, _NCU_OCC) for x in launches]),
            "duration_us": _mean([_duration_us(x) for x in launches]),
        }
        reports.append(_kernel_checks(name, len(launches), m))
    return reports


def _kernel_checks(name: str, launches: int, m: dict[str, float | None]) -> KernelReport:
    sm, mem = m["sm_util_pct"], m["mem_throughput_pct"]
    bound = "memory" if (mem or 0.0) > (sm or 0.0) else "compute"
    mem_min = MEM_THROUGHPUT_MIN_MEMORY_BOUND if bound == "memory" else MEM_THROUGHPUT_MIN_COMPUTE_BOUND

    def check(label: str, value: float | None, lo: float) -> Check:
        return Check(label, value, f"> {lo:g}%", None if value is None else value > lo)

    checks = [
        check("SM utilisation", sm, SM_UTIL_MIN),
        check(f"memory throughput ({bound}-bound)", mem, mem_min),
        check("L2 hit rate", m["l2_hit_pct"], L2_HIT_MIN),
        check("achieved occupancy", m["occupancy_pct"], OCCUPANCY_MIN),
    ]
    return KernelReport(name, launches, bound, m, checks)


# --- output -------------------------------------------------------------------------------

def render(nsys: dict | None, kernels: list[KernelReport] | None) -> str:
    lines: list[str] = []
    if nsys is not None:
        lines.append("Nsight Systems")
        for c in nsys["checks"]:
            lines.append(format_check(c))
        if "short_kernels" in nsys:
            lines.append(f"        kernels shorter than {SHORT_KERNEL_NS // 1000} us: "
                         f"{nsys['short_kernels']:,} of {nsys['trace_kernels']:,}")
    if kernels is not None:
        lines.append("Nsight Compute (mean over each kernel's profiled launches)")
        if not kernels:
            lines.append("  no kernels in the export (check --kernel-name / --nvtx-include)")
        for k in kernels:
            dur = k.metrics.get("duration_us")
            took = f", {dur:,.1f} us each" if dur is not None else ""
            lines.append(f"  {k.name[:90]}  [{k.launches} launch(es){took}, {k.bound}-bound]")
            lines.extend(format_check(c) for c in k.checks)
    return "\n".join(lines)


def _all_checks(nsys: dict | None, kernels: list[KernelReport] | None) -> list[Check]:
    out = list(nsys["checks"]) if nsys else []
    for k in kernels or []:
        out.extend(k.checks)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nsys-prefix", help="PREFIX given to `nsys stats --output` (reads the three CSVs)")
    p.add_argument("--kern-sum", type=Path, help="cuda_gpu_kern_sum CSV (overrides the prefix)")
    p.add_argument("--mem-time-sum", type=Path, help="cuda_gpu_mem_time_sum CSV")
    p.add_argument("--gpu-trace", type=Path, help="cuda_gpu_trace CSV")
    p.add_argument("--ncu-csv", type=Path, help="`ncu --csv --page details` export")
    p.add_argument("--kernel-regex", help="only ncu kernels whose name matches this regex")
    p.add_argument("--steps", type=int, help="engine steps in the capture (kernels per step)")
    p.add_argument("--json", type=Path, help="also write every number and check here")
    p.add_argument("--strict", action="store_true", help="exit 1 if any check fails")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    no_memops = False
    if a.nsys_prefix:
        pre = a.nsys_prefix
        a.kern_sum = a.kern_sum or Path(f"{pre}_cuda_gpu_kern_sum.csv")
        a.mem_time_sum = a.mem_time_sum or Path(f"{pre}_cuda_gpu_mem_time_sum.csv")
        a.gpu_trace = a.gpu_trace or Path(f"{pre}_cuda_gpu_trace.csv")
        # nsys skips the memory report of a capture without copies: that is zero, not an error.
        if not a.mem_time_sum.is_file() and a.kern_sum.is_file():
            no_memops, a.mem_time_sum = True, None
    if not (a.kern_sum or a.mem_time_sum or a.gpu_trace or a.ncu_csv):
        print("summarize.py: give --nsys-prefix, the nsys CSVs, and/or --ncu-csv", file=sys.stderr)
        return 2
    try:
        for p in (a.kern_sum, a.mem_time_sum, a.gpu_trace, a.ncu_csv):
            if p is not None and not p.is_file():
                raise FileNotFoundError(f"no such file: {p}")
        has_nsys = a.kern_sum or a.mem_time_sum or a.gpu_trace
        nsys = nsys_report(a.kern_sum, a.mem_time_sum, a.gpu_trace, no_memops) \
            if has_nsys else None
        kernels = ncu_report(a.ncu_csv, a.kernel_regex) if a.ncu_csv else None
        report = unified_report(a.gpu_trace, a.steps) if a.gpu_trace else None
    except (OSError, ValueError, KeyError) as exc:
        print(f"summarize.py: {exc}", file=sys.stderr)
        return 2
    print(render(nsys, kernels))
    if report is not None:
        print("Verdict\n" + "\n".join(f"  - {v}" for v in report["verdicts"]))
    if a.json:
        doc = {"nsys": {k: ([asdict(c) for c in v] if k == "checks" else v)
                        for k, v in nsys.items()} if nsys else None,
               "ncu": [asdict(k) for k in kernels] if kernels is not None else None,
               "report": report}
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    failed = [c for c in _all_checks(nsys, kernels) if c.passed is False]
    return 1 if (a.strict and failed) else 0


if __name__ == "__main__":
    raise SystemExit(main())
