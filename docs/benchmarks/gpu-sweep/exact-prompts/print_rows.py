"""A sweep pass's rows, the columns the device call scripts print (TTFT, TPOT, output).

    python3 docs/benchmarks/gpu-sweep/exact-prompts/print_rows.py OUT/results.json [KEY ...]

Further keys name more columns (e.g. kernel_busy_pct).
"""
import json
import sys

try:
    rows = json.load(open(sys.argv[1]))
except OSError as e:
    sys.exit(f"no results: {e}")
rows = rows.get("rows", rows) if isinstance(rows, dict) else rows
for r in rows:
    print({k: r.get(k) for k in ("batch_size", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms",
                                 "output_tok_s", "output_tok_s_steady", *sys.argv[2:])})
