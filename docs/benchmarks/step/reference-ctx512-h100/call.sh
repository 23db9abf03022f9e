# Our engine (bf16 / int4 g128 / int8 weights) at 512-token contexts, then the compiled
# gpt-fast-style reference in the same command (.ref/: gpt-fast's model.py and
# reference_decode.py, fetched, not committed).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
for w in bf16 int4 int8; do
timeout 110 python3 -m benchmarks.decode_profile --model synthetic:llama-2-7b --device cuda --dtype bfloat16 --weights-dtype $w --int4-group-size 128 --batch 1 64 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024 --out $OUT/x > $OUT/dp-$w.log 2>&1; echo "$w rc=$?"
grep baseline_only $OUT/dp-$w.log | tee -a $OUT/engine-ctx512.jsonl; grep -i "error" $OUT/dp-$w.log | tail -2; done
date -u
timeout 200 python3 .ref/reference_decode.py --model-py .ref/model.py --preset 7B --batch 1,64 --prompt 512 --out 64 > $OUT/ref.log 2>&1; echo ref rc=$?
tail -2 $OUT/ref.log
date -u
