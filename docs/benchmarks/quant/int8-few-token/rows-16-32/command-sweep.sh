python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
date -u
timeout 150 python3 -m benchmarks.skinny_gemm --json $OUT/skinny-int8-16-32.json --weights int8 --rows 16,32 2>&1 | grep -v -i warn | tee $OUT/skinny-int8-16-32.log
date -u
DP="--model synthetic:llama-2-7b --device cuda --dtype bfloat16 --batch 1 16 32 64 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024 --int4-group-size 128"
for w in bf16 int8 int4 int8; do
  echo "== $w"; timeout 90 python3 .ref/dp_skinny_picks.py $OUT/skinny-int8-16-32.json $DP --weights-dtype $w 2>&1 | grep -v -i warn | grep -v installed | tail -4
done 2>&1 | tee $OUT/dp.log
date -u
timeout 100 python3 .ref/reference_decode.py --model-py .ref/model.py --preset 7B --batch 1,64 --prompt 512 --out 64 2>&1 | grep -v -i warn | tail -4 | tee $OUT/reference.log
date -u
