export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
date -u; nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
timeout 500 python3 -m benchmarks.quant_sweep --json-dir $OUT/sweep --formats int4-g128 --tokens 16,32,64 --engine bf16,int4:128 --budget-s 420 --sweep-budget-s 260 2>&1 | grep -v -i warn | tail -40 | tee $OUT/sweep.log
date -u
