export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_splits.py 2>&1 | tail -5 | tee $OUT/pytest-cuda.log
timeout 220 python3 -m benchmarks.quant_sweep --json-dir $OUT/sweep --formats int4-g128 --tokens 64 --engine bf16,int4:128 --no-install --budget-s 190 --sweep-budget-s 120 2>&1 | grep -v -i warn | tail -12 | tee $OUT/sweep.log
date -u
