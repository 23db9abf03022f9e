export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u
timeout 200 python3 -m benchmarks.quant_sweep --json-dir $OUT/sweep --formats int4-g128 --tokens 16,32,128 --engine "" --sweep-budget-s 150 2>&1 | grep -v -i warn | tail -16 | tee $OUT/sweep.log
DP="--model synthetic:llama-2-7b --device cuda --dtype bfloat16 --int4-group-size 128 --batch 16 32 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024"
A='{}'
B='{"16": {"SPLIT_TARGET": 2}, "32": {"SPLIT_TARGET": 2}}'
run() { echo "== $1 $2"; timeout 80 python3 .ref/dp_cfg.py "$2" $DP --weights-dtype $1 2>&1 | grep -E "step_ms|Error|error" | cut -c1-300 | tail -3; }
{ run int4 "$A"; run int4 "$B"; run bf16 "$A"; run int4 "$A"; run int4 "$B"; } 2>&1 | tee $OUT/dp.log
date -u
