"""Summarise a saved torch.profiler trace (from POST /debug/profile, decode_profile, or any
program's ``export_chrome_trace``): the three numbers, verdicts, top kernels, ranges.

    python -m backend.profiling.report TRACE.json[.gz] [--steps N] [--json OUT] [--strict]

Exit 1 with --strict when the gap ratio or the memcpy share fails its threshold.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from backend.profiling.chrome_trace import report_from_trace
from backend.profiling.summary import render


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", type=Path)
    p.add_argument("--steps", type=int, default=None,
                   help="engine steps in the trace (default: its engine_step ranges)")
    p.add_argument("--json", type=Path, help="also write the report here")
    p.add_argument("--strict", action="store_true", help="exit 1 if a check fails")
    a = p.parse_args(argv)
    report = report_from_trace(a.trace, a.steps)
    print(render(report))
    if a.json:
        a.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    failed = any(c["passed"] is False for c in report["checks"])
    return 1 if a.strict and failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
