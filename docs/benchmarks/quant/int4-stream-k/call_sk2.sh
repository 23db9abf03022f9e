export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 200 python3 -m benchmarks.quant_sweep --json-dir $OUT/sweep --formats int4-g128 --tokens 64 --engine bf16,int4:128 --no-install --budget-s 170 --sweep-budget-s 120 2>&1 | grep -v -i warn | tail -12 | tee $OUT/sweep.log
DP="--model synthetic:llama-2-7b --device cuda --dtype bfloat16 --int4-group-size 128 --batch 64 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024"
run() { echo "== $1 $2"; timeout 75 python3 .ref/dp_stream.py $2 $DP --weights-dtype $1 2>&1 | grep -E "int4-g128 @64|step_ms|Error|error" | cut -c1-400 | tail -3; }
{ run int4 0; run int4 2; run bf16 0; run int4 0; run int4 2; } 2>&1 | tee $OUT/dp.log
date -u
