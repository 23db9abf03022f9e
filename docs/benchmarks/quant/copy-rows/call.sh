#!/bin/bash
# One device call: decode steps of synthetic Llama-2-7B at 512-token contexts (steady, no sync
# between steps, benchmarks.decode_profile), batch 1 / 32 / 64 / 128, each run its own process,
# the quantised layers' dense copies used from the rows timed at start (ROWS auto:
# --gpu-copy-min-rows auto) or from a set row count (65 is the default):
#   bash call.sh TAG:WEIGHTS:COPIES:ROWS ... (COPIES on|off; ROWS auto|N)
#   e.g. bf16:bf16:off:auto int4:int4:on:auto int4-65:int4:on:65 int8:int8:on:auto bf16-2:...
# Then the CUDA tests of the choice and of the copies, and the CPU kernels' tests on this host's
# CPU. Lines into $OUT/steady.jsonl (with the rows each layer shape chose and the µs timed).
export PYTHONUNBUFFERED=1
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
date -u
for spec in "$@"; do
  IFS=: read -r tag weights copies rows <<< "$spec"
  extra="--gpu-copy-min-rows $rows"
  t0=$(date +%s)
  timeout ${RUN_S:-130} python3 -m benchmarks.decode_profile --model synthetic:llama-2-7b \
    --device cuda --dtype bfloat16 --weights-dtype $weights --int4-group-size 128 \
    --prefill-dense-weights $copies $extra --batch 1 32 64 128 --prompt-tokens 512 \
    --warmup 10 --baseline 50 --steps 0 --max-model-len 640 --kv-cache-memory 42 \
    --out $OUT/x > $OUT/dp-$tag.log 2>&1
  echo "$tag rc=$? $(( $(date +%s) - t0 )) s"
  grep baseline_only $OUT/dp-$tag.log | sed "s/^/{\"tag\": \"$tag\", \"row\": /; s/$/}/" \
    >> $OUT/steady.jsonl
  grep baseline_only $OUT/dp-$tag.log | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); c = r['gpu_copy_rows']
    print(r['batch_size'], round(r['step_ms_mean'], 3), c.get('mode'), c.get('rows'), c.get('seconds'))"
  grep -iE "error|Traceback" $OUT/dp-$tag.log | tail -2
done
timeout ${TEST_S:-90} python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_copy_rows.py \
  tests/backend/layers/test_prefill_dense_cuda.py -k "on_cuda or engine_reports" > $OUT/pytest.log 2>&1
echo "pytest rc=$?"; tail -3 $OUT/pytest.log
# the CPU kernels' tests on this host's CPU (AVX-512 where the 2-core VM has AVX2 alone)
grep -o -m1 -E "avx512_vnni|avx512f" /proc/cpuinfo | head -1
timeout ${CPU_TEST_S:-60} python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_cpu_paged_decode.py \
  tests/backend/layers/test_cpu_w4a8.py tests/backend/layers/test_cpu_int8_rows.py > $OUT/pytest-cpu.log 2>&1
echo "pytest cpu rc=$?"; tail -3 $OUT/pytest-cpu.log
date -u
