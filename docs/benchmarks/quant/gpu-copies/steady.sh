# Steady decode steps (no sync between steps, benchmarks.decode_profile) at 512-token contexts,
# batch 1 / 64 / 128, each run its own process: bash steady.sh TAG:WEIGHTS:COPIES:HEAD ...
# (max-model-len 640, KV 42 GiB: on an 80 GB H100 70 GiB of KV left no room for the copies).
#   first call:  bf16:bf16:off:model int4:int4:off:model int4-copies:int4:on:model
#                int4-copies-int8head:int4:on:int8 bf16-2:bf16:off:model
#   second call: the same with int4-2:int4:off:model before bf16-2; third: the first list
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
for spec in "$@"; do
  IFS=: read -r tag weights copies head <<< "$spec"
  timeout 150 python3 -m benchmarks.decode_profile --model synthetic:llama-2-7b --device cuda \
    --dtype bfloat16 --weights-dtype $weights --int4-group-size 128 --prefill-dense-weights $copies \
    --lm-head-dtype $head --batch 1 64 128 --prompt-tokens 512 --warmup 10 --baseline 50 \
    --steps 0 --max-model-len 640 --kv-cache-memory 42 --out $OUT/x > $OUT/dp-$tag.log 2>&1
  echo "$tag rc=$?"; grep baseline_only $OUT/dp-$tag.log | sed "s/^/{\"tag\": \"$tag\", \"row\": /; s/$/}/" | tee -a $OUT/steady.jsonl
  grep -i "error" $OUT/dp-$tag.log | tail -2
done
date -u
