#!/bin/bash
# One device call: the fast launch's CUDA test, then the engine's CUDA correctness check
# (greedy tokens against transformers; Triton attention, with and without CUDA graphs,
# int8 / fp8 K/V, bf16) with the fast launch on. Into $OUT/check.
#   bash docs/benchmarks/step/fast-launch/check.sh        (carry .whl)
set -u
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
D=$OUT/check; mkdir -p $D
timeout 90 python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_launch.py \
  > $D/pytest-launch.log 2>&1; echo "== pytest rc=$?"; tail -3 $D/pytest-launch.log
timeout 150 python3 -m backend.engine.gpu_check --only triton --skip-tests --skip-speed \
  --json $D/gpu-check.json > $D/gpu-check.log 2>&1; echo "== gpu_check rc=$?"
tail -c 1500 $D/gpu-check.json
