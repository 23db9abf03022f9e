#!/bin/bash
# One device call: the stream-K int4 g128 one-token GEMV (out of the tree: stream-gemv.patch,
# applied here first) against the committed GEMV
# (per Llama-2-7B shape, then the engine's batch-1 step alternating in one process), the split
# GEMVs' tests on CUDA, then the CPU kernels' tests on this host's CPU (AVX-512 where the
# 2-core VM has AVX2 alone).
#   bash docs/benchmarks/quant/int4-gemv-stream/call.sh        (carry .whl)
export PYTHONUNBUFFERED=1
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
D=docs/benchmarks/quant/int4-gemv-stream
git apply $D/stream-gemv.patch 2>/dev/null || patch -p1 -N < $D/stream-gemv.patch || exit 1
date -u
timeout ${PROBE_S:-360} python3 $D/stream_probe.py $OUT/stream.json 2>&1 | grep -v -i warn \
  | tee $OUT/stream.log | tail -30
date -u
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_splits.py > $OUT/pytest-splits-cuda.log 2>&1
echo "pytest splits cuda rc=$?"; tail -2 $OUT/pytest-splits-cuda.log
grep -o -m1 -E "avx512_vnni|avx512f" /proc/cpuinfo | head -1
timeout ${CPU_TEST_S:-130} python3 -m pytest -q -p no:cacheprovider tests/backend/layers/test_cpu_paged_decode.py \
  tests/backend/layers/test_cpu_w4a8.py tests/backend/layers/test_cpu_int8_rows.py > $OUT/pytest-cpu.log 2>&1
echo "pytest cpu rc=$?"; tail -3 $OUT/pytest-cpu.log
date -u
