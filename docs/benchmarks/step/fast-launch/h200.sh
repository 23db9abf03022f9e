#!/bin/bash
# One device call on an H200: the ablation's eager rows 3-4 with the fast Triton launch on and
# off in alternating runs (PAIRS pairs, each run its own process; FIRSTTOKEN_FAST_LAUNCH), then
# the whole table (rows 1-7, batches 8-64) with it on. Into $OUT/fl.tgz, saved after each run.
# On CUDA the ablation runs each row in its own process (rows 6-7 in one), which adds a
# process start and a model build a row: allow TABLE_S about 300 s for the table.
#   PAIRS=1 bash docs/benchmarks/step/fast-launch/h200.sh        (carry .whl)
set -u
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
D=$OUT/fl; mkdir -p $D
save() { tar czf $OUT/fl.tgz -C $OUT fl; }
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $D/versions.txt
abl() {  # tag fast rows seconds [extra args]
  FIRSTTOKEN_FAST_LAUNCH=$2 timeout $4 python3 -m benchmarks.ablation \
    --model synthetic:llama-2-7b --device cuda --no-compile --rows $3 "${@:5}" \
    --json $D/ablation-$1.json --markdown $D/ablation-$1.md > $D/ablation-$1.log 2>&1
  echo "== ablation $1 rc=$?"; grep "^| [0-9]" $D/ablation-$1.md 2>/dev/null | cut -c1-200
  save
}
for i in $(seq 1 ${PAIRS:-2}); do
  abl rows34-on-$i 1 3,4 75
  abl rows34-off-$i 0 3,4 75
done
abl table-on 1 1,2,3,4,5,6,7 ${TABLE_S:-300} --batches 8,16,32,64
rm -rf $D
