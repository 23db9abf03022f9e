#!/usr/bin/env bash
# The H200 measurement behind docs/PROFILING.md's examples: torch.profiler captures of the
# engine's decode (synthetic Llama-2-7B, bf16) at batch 1 and 64, their timelines, and the
# Nsight Compute kernel table. Writes everything under $OUT (default runs/profiles-h200).
set -uo pipefail
OUT=${OUT:-runs/profiles-h200}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT/prof"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
"$PY" -c "import torch; print('torch', torch.__version__, torch.version.cuda)"
timeout 240 "$PY" -m benchmarks.decode_profile --model synthetic:llama-2-7b \
    --device cuda --dtype bfloat16 --batch 1 64 --prompt-tokens 128 --warmup 10 \
    --baseline 30 --steps 50 --kv-cache-memory 16 --out "$OUT/prof" 2>&1 \
    | grep -v "^USDT" | tee "$OUT/decode_profile.log"
for b in 1 64; do
  "$PY" -m backend.profiling.timeline "$OUT/prof/profile-b$b.trace.json.gz" \
      "$OUT/timeline-b$b.png" --steps 3 --skip 5 \
      --title "engine decode, synthetic Llama-2-7B bf16, batch $b (H200)"
done
if command -v ncu >/dev/null 2>&1 || [ -x /opt/nvidia/nsight-compute/2025.3.1/ncu ]; then
  command -v ncu >/dev/null 2>&1 || export NCU=/opt/nvidia/nsight-compute/2025.3.1/ncu
  OUT_DIR=/tmp/ncu PYTHON=$PY timeout 110 deploy/nsight/ncu_kernels.sh > /tmp/ncu.log 2>&1
  echo "ncu exit $?"
  tail -40 /tmp/ncu.log | grep -v "^USDT"
  cp /tmp/ncu/kernel_table_summary.json "$OUT/ncu_kernel_table.json" 2>/dev/null
fi
ls -la "$OUT" "$OUT/prof"
