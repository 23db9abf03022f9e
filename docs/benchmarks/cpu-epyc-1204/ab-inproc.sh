#!/usr/bin/env bash
# In-process batch-1 decode, today's tree against 90840f3, alternating, three rounds
set -u
D=/work/main/docs/benchmarks/cpu-epyc-1204
PY=/work/main/.venv/bin/python
for r in 1 2 3; do
  for t in old new; do
    if [ $t = old ]; then cd /tmp/t90840f3; else cd /work/main; fi
    echo "== $t r$r $(date -u +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    flock /work/bench.lock $PY -m benchmarks.quant --cpu auto --reps 7 --tokens 64 --json $D/inproc-$t-r$r.json > /dev/null 2>&1
    python3 -c "import json,sys; r=json.load(open('$D/inproc-$t-r$r.json')); c=r.get('cpu', r); c=c.get('auto', c); print({k: c[k] for k in c if 'median' in k or k in ('weights','kernel','lm_head')})" 2>&1 | tail -1
  done
done
