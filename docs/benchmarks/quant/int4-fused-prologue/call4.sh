# The int4 g128 one-token GEMV with its prologue fused (int4-fused-prologue.patch, not in the
# tree): the engine's int4 step before the patch, then the patch applied, every variant fused
# and unfused against the separate prologue kernel then the GEMV, the chain and the engine on
# the committed tables and with the picks, and the engine's step again (INT4_FUSED empty: the
# patched kernel without a prologue, which must be no slower than the committed one).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
P=docs/benchmarks/quant/int4-fused-prologue/int4-fused-prologue.patch
DP="--model synthetic:llama-2-7b --device cuda --dtype bfloat16 --weights-dtype int4 --int4-group-size 128 --batch 1 64 --prompt-tokens 512 --warmup 10 --baseline 50 --steps 0 --max-model-len 1024"
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
timeout 100 python3 -m benchmarks.decode_profile $DP 2>&1 | grep step_ms | tee $OUT/dp-before.log
git apply $P 2>/dev/null || patch -p1 < $P
timeout 330 python3 -m benchmarks.one_token_gemv --json $OUT/otg.json --chain int4:128 --engine int4:128 --install 2>&1 | grep -v -i warn | tail -20 | tee $OUT/otg.log
timeout 100 python3 -m benchmarks.decode_profile $DP 2>&1 | grep step_ms | tee $OUT/dp-after.log
date -u
