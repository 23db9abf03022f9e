# The eager step ops' flat loop on the GPU: the step-ops tests on CUDA, then the ablation's
# eager rows 3-4 (batch 8, no CUDA graphs) with the flat loop and with each block's own
# forward (LlamaModel.flat_eager), one after the other, in one machine start. Run as
# `bash call.sh`, then on the same machine `ORDER="1 0" SKIP_TESTS=1 bash call.sh`.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1; export PYTHONPATH=/tmp/site:$PWD
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
[ -n "${SKIP_TESTS:-}" ] || timeout 120 python3 -m pytest -q -p no:cacheprovider tests/backend/engine/test_step_ops.py 2>&1 | tail -3
for flat in ${ORDER:-0 1}; do
date -u
timeout 110 python3 - $flat <<'PY' 2>&1 | grep -v -i warn | tail -4
import runpy, sys
from backend.model import LlamaModel
flat = sys.argv[1] == "1"
LlamaModel.flat_eager = flat
out = f"{__import__('os').environ['OUT']}/ablation-rows34-{'flat' if flat else 'layers'}-{__import__('time').strftime('%H%M%S')}.json"
sys.argv = ["ablation", "--model", "synthetic:llama-2-7b", "--device", "cuda", "--no-compile",
            "--no-isolate-rows", "--rows", "3,4", "--json", out]
runpy.run_module("benchmarks.ablation", run_name="__main__")
PY
done
date -u
