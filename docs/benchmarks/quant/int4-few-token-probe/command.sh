# Ran on the H200 2026-12-03 07:11-07:15 UTC on the tree with few-token-int4.patch applied.
# .ref/dp_skinny_picks.py was ../int8-few-token/rows-16-32/dp_skinny_picks.py with an int4 branch
# (install picks into skinny_gemm.INT4_CONFIGS); no int4 tile beat the int4 GEMM, so none was installed.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date -u
timeout 240 python3 -m benchmarks.skinny_gemm --json $OUT/skinny-int4.json --weights int4 --group-size 128 --rows 64 2>&1 | grep -v -i warn | tee $OUT/skinny-int4.log
date -u
DP="--model synthetic:llama-2-7b --device cuda --dtype bfloat16 --batch 1 64 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024 --int4-group-size 128"
for w in int4 int8 bf16 int4; do
  echo "== $w"; timeout 100 python3 .ref/dp_skinny_picks.py $OUT/skinny-int4.json $DP --weights-dtype $w 2>&1 | grep -v -i warn | tail -3
done 2>&1 | tee $OUT/dp.log
date -u
