# The CUDA tests of the dense copies (tests/backend/layers/test_prefill_dense_cuda.py), then
# ab_merge.py: the split decode's merge in the kernel against the separate merge kernel.
# The merge in the kernel was tried and not kept: the tree has the separate kernel, so the
# change is applied here first (it was in the tree when this ran, 2026-12-05 19:52 UTC).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
D=docs/benchmarks/attention/decode-merge
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
patch -s -p1 < $D/merge-in-kernel.patch
patch -s -R -o /tmp/old_triton_attention.py backend/layers/triton_attention.py < $D/merge-in-kernel.patch
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_prefill_dense_cuda.py > $OUT/pytest-copies-cuda.log 2>&1; echo "pytest rc=$?"; tail -2 $OUT/pytest-copies-cuda.log
date -u
timeout 400 python3 $D/ab_merge.py /tmp/old_triton_attention.py $OUT/ab-merge.json 2>&1 | grep -v -i warn | tee $OUT/ab-merge.log | tail -24
date -u
