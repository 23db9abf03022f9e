#!/usr/bin/env bash
# Today's tree against 90840f3 (the tree of the 2026-12-01 runs) on this VM, alternating
set -u
D=/work/main/docs/benchmarks/cpu-epyc-1204
PY=/work/main/.venv/bin/python
for r in 1 2; do
  for t in old new; do
    if [ $t = old ]; then cd /tmp/t90840f3; else cd /work/main; fi
    date -u; uptime
    flock /work/bench.lock $PY -m benchmarks.backend_cpu --skip-transformers --reps 3 --decode-tokens 64 --out $D/ab-$t-r$r.json 2>&1 | grep -E "decode_tok_s_median|aggregate_tok_s_median|Error" | tail -3
  done
done
