#!/bin/bash
# One device call: eager launch cost before / after one profiler capture (probe.py), each mode
# its own process, as torch leaves Kineto (CUPTI stays attached) and with TEARDOWN_CUPTI=1
# (Kineto releases CUPTI when a capture stops; each row says how many kernels the capture
# recorded), ROUNDS times; then, with TEARDOWN_CUPTI=1, the ablation's rows 3-4 in one process
# (--no-isolate-rows, PAIRS runs) and TABLE_ROWS in one (captures beside CUDA graphs); then a
# live server replaying CUDA graphs under load through one POST /debug/profile capture
# (benchmarks.profile_capture, as torch leaves Kineto). Into $OUT/ap.tgz, saved after each part.
#   bash docs/benchmarks/step/after-profile/call.sh        (carry .whl; about 4 min)
#   PAIRS=1 TABLE_ROWS=5,6,7 bash ...   (the rows with TEARDOWN_CUPTI=1 too, as on 2026-12-07)
set -u
export PYTHONUNBUFFERED=1
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
D=$OUT/ap; mkdir -p $D
save() { tar czf $OUT/ap.tgz -C $OUT ap; }
P=docs/benchmarks/step/after-profile/probe.py
date -u
for r in $(seq 1 ${ROUNDS:-2}); do
  for mode in ${MODES:-none warm cuda}; do
    timeout 60 python3 $P $mode $D/probe.jsonl 2>&1 | grep -v -i warn | tail -1 | cut -c1-300
    [ $mode = none ] || timeout 60 env TEARDOWN_CUPTI=1 python3 $P $mode $D/probe.jsonl 2>&1 \
      | grep -v -i warn | tail -1 | cut -c1-300
  done
done
save
abl() {  # tag rows seconds [extra args]
  timeout $3 env TEARDOWN_CUPTI=1 python3 -m benchmarks.ablation --model synthetic:llama-2-7b \
    --device cuda --no-compile --no-isolate-rows --rows $2 "${@:4}" --json $D/ablation-$1.json \
    --markdown $D/ablation-$1.md > $D/ablation-$1.log 2>&1
  echo "== ablation $1 rc=$?"; grep "^| [0-9]" $D/ablation-$1.md 2>/dev/null | cut -c1-160
  grep -iE "error|Traceback|Segmentation" $D/ablation-$1.log | tail -3
  save
}
for i in $(seq 1 ${PAIRS:-0}); do abl rows34-td-$i 3,4 80; done
[ -z "${TABLE_ROWS:-}" ] || abl table-td $TABLE_ROWS ${TABLE_S:-150} --batches 8,16,32,64
if [ "${LIVE_S:-200}" != 0 ]; then
  timeout ${LIVE_S:-200} python3 -m benchmarks.profile_capture --model synthetic:llama-2-7b \
    --backend-args "--device cuda --dtype bfloat16 --kv-cache-memory 16 --max-num-seqs 32 --max-model-len 1024" \
    --concurrency 32 --seconds 10 --out $D/live.json > $D/live.log 2>&1
  echo "== live rc=$?"; tail -5 $D/live.log
  save
fi
date -u
