export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/pydantic*.whl .whl/annotated*.whl .whl/typing*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u
DP="--model synthetic:llama-2-7b --device cuda --dtype bfloat16 --batch 1 16 32 64 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024 --int4-group-size 128"
for w in bf16 int8 int4 int8; do
  echo "== $w"; timeout 75 python3 .ref/dp_skinny_picks.py .ref/skinny-int8-16-32.json $DP --weights-dtype $w 2>&1 | grep -v -i warn | grep -v installed | tail -4
done 2>&1 | tee $OUT/dp.log
date -u
