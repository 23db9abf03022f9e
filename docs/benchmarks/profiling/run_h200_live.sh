#!/usr/bin/env bash
# The live-server measurement behind docs/PROFILING.md: POST /debug/profile {"steps": 50}
# on `python -m backend` (synthetic Llama-2-7B, bf16, H200) under 32 concurrent streams,
# TTFT with and without the capture. Writes under $OUT (default runs/profiles-h200-live).
set -uo pipefail
OUT=${OUT:-runs/profiles-h200-live}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$OUT"
timeout 300 "$PY" -m benchmarks.profile_capture --model synthetic:llama-2-7b \
    --backend-args "--device cuda --dtype bfloat16 --kv-cache-memory 16 --max-num-seqs 32 --max-model-len 1024" \
    --concurrency 32 --prompt-tokens 128 --output-tokens 64 --warmup 8 --seconds 12 \
    --capture-steps 50 --out "$OUT/live_capture_c32.json" 2>&1 | grep -v "^USDT" \
    | tee "$OUT/live_capture.log"
for f in runs/profiles/*.json; do gzip -c "$f" > "$OUT/live_capture_c32.trace.json.gz"; done
ls -la "$OUT"
