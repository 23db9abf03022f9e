#!/bin/bash
# One device call: probe.py's launch cost before / after one capture with the capture's own
# TEARDOWN_CUPTI default and with TEARDOWN_CUPTI=0 (as torch leaves Kineto), alternating, each
# run its own process; then a live server replaying CUDA graphs under load through one
# POST /debug/profile capture (benchmarks.profile_capture) with that default. Into $OUT/ap.tgz.
#   bash docs/benchmarks/step/after-profile/call2.sh       (carry .whl)
set -u
export PYTHONUNBUFFERED=1
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
D=$OUT/ap; mkdir -p $D
save() { tar czf $OUT/ap.tgz -C $OUT ap; }
P=docs/benchmarks/step/after-profile/probe.py
date -u
for r in $(seq 1 ${ROUNDS:-3}); do
  for mode in ${MODES:-cuda warm}; do
    timeout 60 python3 $P $mode $D/probe.jsonl 2>&1 | tail -1 | cut -c1-220
    timeout 60 env TEARDOWN_CUPTI=0 python3 $P $mode $D/probe.jsonl 2>&1 | tail -1 | cut -c1-220
  done
done
save
timeout ${LIVE_S:-200} python3 -m benchmarks.profile_capture --model synthetic:llama-2-7b \
  --backend-args "--device cuda --dtype bfloat16 --kv-cache-memory 16 --max-num-seqs 32 --max-model-len 1024" \
  --concurrency 32 --seconds 10 --out $D/live.json > $D/live.log 2>&1
echo "== live rc=$?"; tail -5 $D/live.log
save; rm -rf $D
date -u
