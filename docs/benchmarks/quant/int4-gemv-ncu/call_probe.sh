# bash call_probe.sh regs|tiled: a probe of the int4 g128 one-token GEMV with its patch
# applied to the tree first. regs: launch variants with a register cap (regs_probe.py;
# maxnreg.patch passes Triton's maxnreg through; run 2026-12-05 19:36 UTC). tiled: the
# codes read tile-major against row-major (tiled_probe.py, tiled.patch; run 2026-12-05 21:41 UTC).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
D=docs/benchmarks/quant/int4-gemv-ncu
case "$1" in regs) P=maxnreg.patch ;; tiled) P=tiled.patch ;; *) echo "regs or tiled"; exit 2 ;; esac
patch -s -p1 < $D/$P
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
timeout 420 python3 $D/$1_probe.py $OUT/$1.json 2>&1 | grep -v -i warn | tee $OUT/$1.log | tail -30
date -u
