#!/bin/bash
# One device call: three changes to the int4 g128 batch-1 step on CUDA (the RMSNorm split
# between the one-token GEMVs; the GEMVs' first weight loads before the wait for the previous
# kernel; the decode attention's first K/V tile before its wait): their tests, the engine's
# batch-1 step at 512-token contexts with each (ab.py; VARIANTS), the same step in a process
# each through decode_profile (all three through the profiler: kernel time by name; none;
# the early loads only), then the GEMV's split sum and the split's two halves priced per
# Llama-2-7B shape (probe.py). Into $OUT. Later parts run only while the call is under
# DEADLINE seconds (default 420).
#   bash docs/benchmarks/quant/int4-gemv-partials/call.sh        (carry .whl)
#   PROBE_S=0 skips the probe; AB_ONLY=1 stops after the tests and ab.py; AB=0 skips them
#   (a second call: decode_profile and the probe)
export PYTHONUNBUFFERED=1
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
D=docs/benchmarks/quant/int4-gemv-partials
DEADLINE=${DEADLINE:-420}
date -u
if [ "${AB:-1}" = 1 ]; then
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_split_norm_cuda.py \
  tests/backend/layers/test_early_loads_cuda.py tests/backend/layers/test_splits.py \
  > $OUT/pytest-cuda.log 2>&1
echo "pytest cuda rc=$?"; tail -3 $OUT/pytest-cuda.log
VARIANTS=${VARIANTS:-kernel,split,early,early_all,split_early_all} timeout ${AB_S:-300} python3 $D/ab.py \
  $OUT/ab.json 2>&1 | grep -v -i warn | tee $OUT/ab.log | tail -10
date -u
fi
[ "${AB_ONLY:-0}" = 1 ] && exit 0
dp() {  # tag split early attention-early steps
  [ $SECONDS -gt $DEADLINE ] && { echo "== decode_profile $1 skipped (${SECONDS} s)"; return; }
  timeout 100 env FIRSTTOKEN_SPLIT_NORM=$2 FIRSTTOKEN_INT4_EARLY=$3 FIRSTTOKEN_ATTN_EARLY=$4 \
    python3 -m benchmarks.decode_profile \
    --model synthetic:llama-2-7b --device cuda --dtype bfloat16 --weights-dtype int4 \
    --int4-group-size 128 --batch 1 --prompt-tokens 512 --warmup 10 --baseline 50 \
    --steps $5 --max-model-len 1024 --out $OUT/dp-$1 > $OUT/dp-$1.log 2>&1
  echo "== decode_profile $1 rc=$?"; grep -v -i warn $OUT/dp-$1.log | grep -iE "batch|step|ms|kernel" | head -30
}
dp all 1 1 1 20
dp kernel 0 0 0 0
dp early_all 0 1 1 0
(cd $OUT && tar czf dp.tgz dp-* 2>/dev/null; rm -rf dp-all* dp-kernel* dp-early_all*)
date -u
if [ "${PROBE_S:-180}" != 0 ] && [ $SECONDS -lt $DEADLINE ]; then
  timeout ${PROBE_S:-180} python3 $D/probe.py $OUT/partials.json 2>&1 | grep -v -i warn \
    | tee $OUT/partials.log | tail -12
  date -u
fi
