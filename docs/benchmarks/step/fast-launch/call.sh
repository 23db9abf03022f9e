#!/bin/bash
# One device call: the fast Triton launch (backend/layers/launch.py) on CUDA.
#  1. its tests and the fused ops' on CUDA (compiled kernels, fast launches in them);
#  2. the ablation's eager rows 3-4 with the fast launch on, then off (one process
#     each; FIRSTTOKEN_FAST_LAUNCH);
#  3. the eager-host probe (row 3): host µs per launch and per step piece, both ways;
#  4. the ablation's rows 1, 2 and 5 with it on, and the Triton attention tests on CUDA,
#     in what time is left.
# Everything into $OUT/fl.tgz, saved after each stage (a cut-off call keeps what ran).
#   bash docs/benchmarks/step/fast-launch/call.sh        (carry .whl)
set -u
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
D=$OUT/fl; mkdir -p $D
save() { tar czf $OUT/fl.tgz -C $OUT fl; }
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" | tee $D/versions.txt
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_launch.py \
  tests/backend/layers/test_fused_ops.py tests/backend/layers/test_eager_ops.py \
  > $D/pytest-launch.log 2>&1; echo "== pytest rc=$?"; tail -3 $D/pytest-launch.log; save
abl() {  # tag fast rows seconds
  FIRSTTOKEN_FAST_LAUNCH=$2 timeout $4 python3 -m benchmarks.ablation \
    --model synthetic:llama-2-7b --device cuda --no-compile --rows $3 \
    --json $D/ablation-$1.json --markdown $D/ablation-$1.md > $D/ablation-$1.log 2>&1
  echo "== ablation $1 rc=$?"; cat $D/ablation-$1.md 2>/dev/null | grep "^|" | cut -c1-240
  save
}
abl rows34-on 1 3,4 75
abl rows34-off 0 3,4 75
DECODE_GPU=0 timeout 100 python3 docs/benchmarks/step/eager-host/probe.py $D/probe \
  synthetic:llama-2-7b cuda row3 > $D/probe.log 2>&1; echo "== probe rc=$?"
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r['rows'][0]); \
print(r['launch']); print(r['pieces_us']); print(r.get('pieces_us_jit_launch'))" $D/probe/probe.json
save
abl rows125-on 1 1,2,5 100
timeout ${ATTN_S:-60} python3 -m pytest -q -x -p no:cacheprovider \
  tests/backend/layers/test_triton_attention.py > $D/pytest-attention.log 2>&1
echo "== pytest attention rc=$?"; tail -3 $D/pytest-attention.log; save
rm -rf $D
