# Ran on the H200 2026-12-03 06:47-06:50 UTC. dp_int8_skinny.py installed this run's picks before
# decode_profile; they are now skinny_gemm.INT8_CONFIGS, so plain
# `python -m benchmarks.decode_profile ... --weights-dtype int8` reproduces the last step.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date -u
timeout 300 python3 -m benchmarks.skinny_gemm --json $OUT/skinny-int8.json --weights int8 --rows 64 2>&1 | grep -v -i warn | tee $OUT/skinny-int8.log
date -u
DP="--model synthetic:llama-2-7b --device cuda --dtype bfloat16 --batch 1 64 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024"
for w in int8 bf16; do
  echo "== $w"; timeout 120 python3 .ref/dp_int8_skinny.py $OUT/skinny-int8.json $DP --weights-dtype $w 2>&1 | grep -v -i warn | tail -4
done 2>&1 | tee $OUT/dp.log
date -u
