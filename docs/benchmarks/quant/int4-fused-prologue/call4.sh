# The int4 g128 one-token GEMV with its prologue fused, every variant against the separate
# prologue kernel then the GEMV; the chain and engine before and after installing the picks.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
timeout 540 python3 -m benchmarks.one_token_gemv --json $OUT/otg.json --chain int4:128 --engine int4:128 --install 2>&1 | grep -v -i warn | tail -20 | tee $OUT/otg.log
date -u
