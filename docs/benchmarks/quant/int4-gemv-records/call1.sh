export PYTHONUNBUFFERED=1
# rec_kernel.py (the probe kernel) is kept as rec_kernel.patch: it is written out first
mkdir -p /tmp/rk && (cd /tmp/rk && git apply $PWD/docs/benchmarks/quant/int4-gemv-records/rec_kernel.patch)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD:$PWD/docs/benchmarks/quant/int4-gemv-records:/tmp/rk
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
timeout 560 python3 docs/benchmarks/quant/int4-gemv-records/rec_probe.py $OUT/probe 2>&1 | grep -v -i warn | tee $OUT/probe.log | tail -30
date -u
