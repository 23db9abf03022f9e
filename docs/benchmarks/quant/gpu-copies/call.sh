# The CUDA tests of the dense copies, then drive.py (bf16 / int4 g128 without and with copies,
# alternating; then int4 with copies and an int8 head, and int8 without and with copies).
# Run at commit 8525ea2 (copies from 64 rows) on an H100, and at the committed code on an H200.
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
timeout 120 python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_prefill_dense_cuda.py > $OUT/pytest-cuda.log 2>&1; echo "pytest rc=$?"; tail -3 $OUT/pytest-cuda.log
date -u
timeout 420 python3 docs/benchmarks/quant/gpu-copies/drive.py $OUT/copies.json > $OUT/drive.log 2>&1; echo "drive rc=$?"
grep -v -i warn $OUT/drive.log | tail -12
date -u
