python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD; export PATH=/tmp/site/bin:$PATH
date -u
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader
timeout 150 python3 -m benchmarks.decode_profile --model synthetic:llama-2-7b --device cuda --dtype bfloat16 --batch 1 64 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024 --out $OUT/ours > $OUT/ours.log 2>&1; echo ours rc=$?
grep baseline_only $OUT/ours.log
date -u
timeout 380 python3 REF/reference_decode.py --model-py REF/model.py --preset 7B --batch 1,64 --prompt 512 --out 64 > $OUT/ref.log 2>&1; echo ref rc=$?
tail -5 $OUT/ref.log
date -u
