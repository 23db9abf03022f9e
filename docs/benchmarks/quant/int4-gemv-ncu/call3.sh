# The int4 g128 one-token GEMV on tile-major codes (tiled.patch, applied here) against the
# row-major codes (tiled_probe.py).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
D=docs/benchmarks/quant/int4-gemv-ncu
patch -s -p1 < $D/tiled.patch
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
timeout 300 python3 $D/tiled_probe.py $OUT/tiled.json 2>&1 | grep -v -i warn | tee $OUT/tiled.log | tail -8
date -u
