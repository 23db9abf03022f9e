export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u
TRITON_INTERPRET=0 timeout 120 python3 .ref/dq_check.py 2>&1 | grep -v -i warn | tee $OUT/dq_check.log
run() { timeout 90 python3 .ref/ttft_q.py $1 $2 2>&1 | grep -E "^\{|Error|error" | tail -2; }
{ run bf16 new; run int4 torch; run int4 new; run int8 torch; run int8 new; run int4 new; run int4 torch; } 2>&1 | tee $OUT/ttft.log
date -u
# The second call (whole-groups/) ran the same lines up to dq_check.py, then:
#   { run int4 new; run bf16 new; run int4 new; } 2>&1 | tee $OUT/ttft.log
