#!/usr/bin/env bash
# Nsight Compute's kernel table for the decode step's attention kernel and matmuls, in one
# command, with thresholds (SM > 60%, memory throughput > 50/80%, L2 hit > 40%,
# occupancy > 50%). A thin layer over ncu_attention.sh with other defaults:
#
#   deploy/nsight/ncu_kernels.sh [-- CMD ...]
#
# * the target is benchmarks.decode_profile at batch 64 (synthetic Llama-2-7B shapes
#   with 2 layers: the same kernels, ~1 GiB of weights instead of 13 for ncu to save and
#   restore before every replay pass), no CUDA graphs (kernels launched one by one), no
#   torch.profiler capture (--steps 0: CUPTI tracing and ncu exclude each other);
# * kernels: attention (flash/fmha/cuDNN/SDPA) and matmuls (cuBLAS gemm/gemv, nvjet, cutlass,
#   xmma), after LAUNCH_SKIP matching launches (the prefill);
# * --clock-control none: the clocks the GPU really runs at;
# * sections SpeedOfLight, MemoryWorkloadAnalysis and Occupancy only (--set basic plus L2),
#   about a quarter of --set full's replay passes.
#
# Environment: as ncu_attention.sh, with these defaults: NAME [kernel_table]
#   KERNEL_REGEX ['attention|attn|flash|fmha|cudnn|gemm|gemv|nvjet|cutlass|xmma']
#   LAUNCH_SKIP [200]  LAUNCH_COUNT [12]  NCU_SET [basic]  CLOCK_CONTROL [none]
#   NCU_EXTRA ['--section MemoryWorkloadAnalysis']
#   DECODE_ARGS ['--model synthetic:llama-2-7b --num-layers 2 --dtype bfloat16 --batch 64
#                 --prompt-tokens 16 --warmup 2 --baseline 4 --steps 0 --no-cuda-graph
#                 --kv-cache-memory 2']
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON=${PYTHON:-python}
DECODE_ARGS=${DECODE_ARGS:---model synthetic:llama-2-7b --num-layers 2 --dtype bfloat16 --batch 64 --prompt-tokens 16 --warmup 2 --baseline 4 --steps 0 --no-cuda-graph --kv-cache-memory 2}
export NAME=${NAME:-kernel_table}
export KERNEL_REGEX=${KERNEL_REGEX:-attention|attn|flash|fmha|cudnn|gemm|gemv|nvjet|cutlass|xmma}
export LAUNCH_SKIP=${LAUNCH_SKIP:-200}
export LAUNCH_COUNT=${LAUNCH_COUNT:-12}
export NCU_SET=${NCU_SET:-basic}
export CLOCK_CONTROL=${CLOCK_CONTROL:-none}
export NCU_EXTRA=${NCU_EXTRA:---section MemoryWorkloadAnalysis}
export PYTHON
case "${1:-}" in
  -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
  --) exec "$HERE/ncu_attention.sh" "$@" ;;
esac
# shellcheck disable=SC2086  # DECODE_ARGS is split on purpose
exec "$HERE/ncu_attention.sh" -- "$PYTHON" -m benchmarks.decode_profile --device cuda $DECODE_ARGS "$@"
