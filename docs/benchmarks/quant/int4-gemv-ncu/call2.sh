# The launch variants of the int4 g128 one-token GEMV (regs_probe.py). The register cap reaches Triton
# through ``maxnreg.patch`` (a launch option; not kept in the tree).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
D=docs/benchmarks/quant/int4-gemv-ncu
patch -s -p1 < $D/maxnreg.patch
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
timeout 420 python3 $D/regs_probe.py $OUT/regs.json 2>&1 | grep -v -i warn | tee $OUT/regs.log | tail -30
date -u
