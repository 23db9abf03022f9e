# The shorter call when little device time is left: only the fused-prologue int4 patch,
# timed layer by layer and in the engine with its picks (benchmarks.one_token_gemv --install).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
git apply docs/benchmarks/quant/int4-fused-prologue/int4-fused-prologue.patch || exit 3
timeout 300 python3 -m benchmarks.one_token_gemv --json $OUT/otg.json --chain int4:128 --engine int4:128 --install 2>&1 | grep -v -i warn | tail -20
date -u
