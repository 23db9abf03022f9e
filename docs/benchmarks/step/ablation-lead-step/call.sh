#!/bin/bash
# One device call: the ablation table (rows 1-7, batches 8-64) with the profiler's lead step
# (kernel-busy counts the work in flight when a capture starts). On an H200 the int8 kernel-busy
# sweep runs first (../../gpu-sweep/exact-prompts/int8-kernel-busy/call.sh, into $OUT/kb).
#   bash docs/benchmarks/step/ablation-lead-step/call.sh
set -u
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader)
tag=h100; case "$gpu" in *H200*) tag=h200;; esac
if [ "$tag" = h200 ]; then
  mkdir -p "$OUT/kb"
  OUT="$OUT/kb" bash docs/benchmarks/gpu-sweep/exact-prompts/int8-kernel-busy/call.sh
fi
# the sweep's script installed the wheels in its own shell: this one needs its PYTHONPATH too
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
timeout ${ABLATION_S:-240} python3 -m benchmarks.ablation --model synthetic:llama-2-7b --device cuda \
    --no-compile --batches 8,16,32,64 --json $OUT/ablation-$tag.json \
    --markdown $OUT/ablation-$tag.md > $OUT/ablation-$tag.log 2>&1
echo "== ablation rc=$?"; tail -16 $OUT/ablation-$tag.log
