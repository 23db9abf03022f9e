#!/bin/bash
# On a host where AOTInductor packages crash the process that loads them: the three loaders
# (loaders.sh), then the GEMV package built and loaded through backend.layers.cpu_aot, whose
# load is checked in a fresh process first: a refusal (RuntimeError) here, not a crash.
bash docs/benchmarks/quant/aoti-load/loaders.sh
cat > /tmp/guard.py <<'PY'
import tempfile, torch
from pathlib import Path
from backend.layers import cpu_aot
d = Path(tempfile.mkdtemp())
path, seconds = cpu_aot.build(d, 256, 128, torch.float32)
print("built", path.name, round(seconds, 1), flush=True)
try:
    cpu_aot.load(d, 256, 128, torch.float32)
    print("loaded (no refusal)")
except RuntimeError as e:
    print("refused:", e)
print("this process goes on; .loads:", path.with_name(path.name + ".loads").exists())
PY
timeout 300 python3 /tmp/guard.py 2>&1 | grep -v Warning | tail -4 | tee $OUT/guard.txt
echo "guard rc=${PIPESTATUS[0]}"
