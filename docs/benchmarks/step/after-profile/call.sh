#!/bin/bash
# One device call: eager launch cost before / after one profiler capture (probe.py), each mode
# its own process, with TEARDOWN_CUPTI=0 (CUPTI kept attached, as torch leaves Kineto) and =1
# (Kineto releases CUPTI when a capture stops; a CUDA capture's default since); then the
# ablation's rows 3-4 in one process (--no-isolate-rows) and rows 5-7 in one, with
# TEARDOWN_CUPTI=1. Into $OUT/ap.tgz.
#   bash docs/benchmarks/step/after-profile/call.sh        (carry .whl)
#   MODES="none cuda" TABLE_ROWS=5,6 TABLE_S=90 bash ...    (a short call)
set -u
export PYTHONUNBUFFERED=1
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
D=$OUT/ap; mkdir -p $D
save() { tar czf $OUT/ap.tgz -C $OUT ap; }
P=docs/benchmarks/step/after-profile/probe.py
date -u
for mode in ${MODES:-none warm cpu cuda}; do
  timeout 60 env TEARDOWN_CUPTI=0 python3 $P $mode $D/probe.jsonl 2>&1 | grep -v -i warn | tail -1
  [ $mode = none ] || timeout 60 env TEARDOWN_CUPTI=1 python3 $P $mode $D/probe.jsonl 2>&1 | grep -v -i warn | tail -1
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
for i in $(seq 1 ${PAIRS:-1}); do abl rows34-td-$i 3,4 80; done
abl table-td ${TABLE_ROWS:-5,6,7} ${TABLE_S:-150} --batches 8,16,32,64
date -u
