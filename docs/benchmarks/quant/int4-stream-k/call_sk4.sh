export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
TRITON_INTERPRET=0 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_splits.py -k stream 2>&1 | grep -v -i warn | grep -E "Error|error|assert|Mismatch|Greatest|elements" | head -20
TRITON_INTERPRET=0 timeout 200 python3 .ref/check_sk.py 2>&1 | grep -v -i warn | tee $OUT/check_sk.log
