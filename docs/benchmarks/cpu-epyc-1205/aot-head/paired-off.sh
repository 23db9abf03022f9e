#!/usr/bin/env bash
# Ours with the compiled head GEMV (the default, the package make model built) against ours
# with --cpu-aot-kernels off (torch's kernel) as the "peer" on port 8002, paired request by
# request (the two servers up together, order alternating), RUNS times, under the lock.
# Run 2026-12-05 22:09-22:12 UTC, before the compiled one-token layer pieces existed: today
# --cpu-aot-kernels off turns those off too, so a re-run compares both against eager.
set -u
cd /work/main
D=docs/benchmarks/cpu-epyc-1205/aot-head
PY=.venv/bin/python
$PY -m backend --model smollm2-135m-instruct --port 8002 --cpu-aot-kernels off --log-level WARNING > /tmp/ours-off.log 2>&1 &
OP=$!
for i in $(seq 120); do curl -s -o /dev/null http://127.0.0.1:8002/health && break; sleep 1; done
curl -s http://127.0.0.1:8002/health | $PY -c "import json,sys; h=json.load(sys.stdin); print('peer:', h['lm_head_kernel'], h['cpu_aot_kernels'])"
for r in ${RUNS:-1 2}; do
  date -u; uptime
  flock /work/bench.lock $PY -m benchmarks.backend_cpu --peer-url http://127.0.0.1:8002 --paired --reps 10 --decode-tokens 64 --out $D/paired-off-$r.json 2>&1 | grep -E "decode_batch1|median\"" | head -8
done
kill $OP; wait $OP 2>/dev/null
date -u; uptime
