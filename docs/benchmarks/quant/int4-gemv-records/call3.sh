# The probe (rec_probe.py, rec_kernel.py) against the tree before the change (commit
# 07c865c, its backend/ and benchmarks/ carried as .old/), then the sweep at one token on
# the committed tree.
export PYTHONUNBUFFERED=1
# rec_kernel.py (the probe kernel) is kept as rec_kernel.patch: it is written out first
mkdir -p /tmp/rk && (cd /tmp/rk && git apply $PWD/docs/benchmarks/quant/int4-gemv-records/rec_kernel.patch)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
R=docs/benchmarks/quant/int4-gemv-records
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
PYTHONPATH=/tmp/site:$PWD/.old:$PWD/$R:/tmp/rk timeout 280 python3 $R/rec_probe.py $OUT/probe 2>&1 | grep -v -i warn | tee $OUT/probe.log | tail -30
date -u
PYTHONPATH=/tmp/site:$PWD timeout 230 python3 -m benchmarks.quant_sweep --json-dir $OUT/sweep --formats int4-g128 --tokens 1 --engine "" --sweep-budget-s 170 2>&1 | grep -v -i warn | tail -16 | tee $OUT/sweep.log
date -u
