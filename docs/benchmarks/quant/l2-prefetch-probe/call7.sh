export PYTHONUNBUFFERED=1
# The drivers ran from a git-ignored scratch folder (.ref/); copies of them lie beside this file.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/pydantic*.whl .whl/annotated*.whl .whl/typing*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u
timeout 100 python3 .ref/check_prefetch.py 2>&1 | grep -v -i warn | tee $OUT/check.log
DP="--model synthetic:llama-2-7b --device cuda --dtype bfloat16 --int4-group-size 128 --batch 1 --prompt-tokens 512 --warmup 10 --baseline 100 --steps 0 --max-model-len 1024"
run() { echo "== $1 $2"; timeout 70 python3 .ref/dp_prefetch.py $2 $DP --weights-dtype $1 2>&1 | grep -E "step_ms|Error|error" | tail -3; }
{ for v in 0:0 2:0 1:0 2:1 0:1; do run int4 $v; done
  for v in 0:0 2:1 2:0 1:0; do run int4 $v; done
  for v in 0:0 0:1; do run bf16 $v; done
  for v in 0:0 2:1; do run int8 $v; done; } 2>&1 | tee $OUT/dp.log
date -u
