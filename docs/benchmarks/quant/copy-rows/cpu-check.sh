#!/bin/bash
# The CPU kernels' tests on the device host's CPU (AVX-512), the op's refusals (a
# TORCH_CHECK thrown out of our torch op) left out, then one refusal in a process of its own:
# its exit status and the end of its output, with the compiler and torch beside.
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
grep -m1 "^flags" /proc/cpuinfo | tr ' ' '\n' | grep -E "^avx512(f|bw|vl|_vnni)$" | tr '\n' ' '; echo
c++ --version | head -1
python3 -c "import torch; print(torch.__version__, torch._C._GLIBCXX_USE_CXX11_ABI)"
timeout ${CPU_TEST_S:-200} python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_cpu_w4a8.py \
  tests/backend/layers/test_cpu_int8_rows.py tests/backend/layers/test_cpu_paged_decode.py \
  -k "not writes_a_range_of_tiles and not refusals" > $OUT/pytest-cpu.log 2>&1
echo "pytest cpu rc=$?"; tail -3 $OUT/pytest-cpu.log
cat > /tmp/refuse.py <<'PY'
import tempfile, torch
from backend.layers import cpu_w4a8
d = tempfile.mkdtemp()
cpu_w4a8.build(d); cpu_w4a8.load(d)
print("loaded", cpu_w4a8.flags(), flush=True)
tiles = torch.zeros(4, 16, 64, dtype=torch.uint8); sm = torch.zeros(4, 4, 2, 16, dtype=torch.half)
try:
    torch.ops.firsttoken.int4_w4a8_mm(torch.zeros(1, 128), tiles, sm, 3)
except RuntimeError as e:
    print("raised:", str(e).splitlines()[0], flush=True)
PY
timeout 200 python3 /tmp/refuse.py > $OUT/refuse.log 2>&1; echo "refusal rc=$?"; tail -5 $OUT/refuse.log
