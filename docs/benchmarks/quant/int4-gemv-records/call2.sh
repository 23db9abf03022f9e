# The committed tree (scale_min records in the product code), one H200 call.
export PYTHONUNBUFFERED=1
# rec_kernel.py (the probe kernel) is kept as rec_kernel.patch: it is written out first
mkdir -p /tmp/rk && (cd /tmp/rk && git apply $PWD/docs/benchmarks/quant/int4-gemv-records/rec_kernel.patch)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
R=docs/benchmarks/quant/int4-gemv-records
export PYTHONPATH=/tmp/site:$PWD:$PWD/$R:/tmp/rk
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
timeout 120 python3 $R/check_gpu.py $OUT/check_gpu.json 2>&1 | grep -v -i warn | tee $OUT/check_gpu.log | cut -c1-400
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_splits.py 2>&1 | tail -3 | tee $OUT/pytest-splits-cuda.log
DP="--model synthetic:llama-2-7b --device cuda --dtype bfloat16 --int4-group-size 128 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024"
run() { echo "== $*"; timeout $1 python3 -m benchmarks.decode_profile $DP --weights-dtype $2 --batch ${@:3} 2>&1 | grep -E "step_ms|Error|error" | cut -c1-300 | tail -4; }
{ run 110 int4 1 16 32 64; run 100 bf16 1 16 32 64; run 90 int4 1 64; } 2>&1 | tee $OUT/dp.log
timeout 80 python3 $R/../prefill-dequant/ttft_q.py int4 new 2>&1 | grep -E "^\{|Error|error" | tail -2 | tee $OUT/ttft.log
date -u
