# call3.sh again, with the int4 codes twice (bf16, int4, int4 with copies, with copies and
# an int8 head, int4, bf16): steady decode steps at 512-token contexts, batch 1 / 64 / 128.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
run() {  # tag weights copies head
  timeout 150 python3 -m benchmarks.decode_profile --model synthetic:llama-2-7b --device cuda \
    --dtype bfloat16 --weights-dtype $2 --int4-group-size 128 --prefill-dense-weights $3 \
    --lm-head-dtype $4 --batch 1 64 128 --prompt-tokens 512 --warmup 10 --baseline 50 \
    --steps 0 --max-model-len 640 --kv-cache-memory 42 --out $OUT/x > $OUT/dp-$1.log 2>&1
  echo "$1 rc=$?"; grep baseline_only $OUT/dp-$1.log | sed "s/^/{\"tag\": \"$1\", \"row\": /; s/$/}/" | tee -a $OUT/steady.jsonl
  grep -i "error" $OUT/dp-$1.log | tail -2
}
run bf16 bf16 off model
run int4 int4 off model
run int4-copies int4 on model
run int4-copies-int8head int4 on int8
run int4-2 int4 off model
run bf16-2 bf16 off model
date -u
