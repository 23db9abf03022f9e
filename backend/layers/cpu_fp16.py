"""fp16 weights on the CPU through fbgemm's packed fp16 GEMM (``quantized.linear_dynamic_fp16``,
part of torch's x86 builds): float32 activations, weights stored as fp16 in fbgemm's blocked
layout and widened in registers (F16C), float32 accumulation.

On CPUs without native bf16 (AVX2 only) the model runs in float32, and a decode step is bound
by reading float32 weights. Half the bytes through this kernel decoded SmolLM2 1.7x faster
at batch 1 than the dense float32 matmul on a 2-core AVX2 VM (docs/BENCHMARKS.md); rounding
float32 weights to fp16 changes a layer's output by about 2e-4 relative. For many rows
(prefill) fbgemm's kernel lost to the dense float32 matmul (0.8x at 512 rows), so there the
layer widens its fp16 weight into a reused scratch buffer and runs the dense matmul on it
(``cpu_dequant.widened_matmul``): a 512-token prefill took 1-2 % longer than on float32
weights.
"""
from __future__ import annotations

import torch

# Rows (tokens) from which a call widens the weight and runs the dense matmul instead.
# fbgemm's packed kernel won at 1 and 8 rows on every SmolLM2 shape timed and was mixed at
# 64 (0.8-1.4x), on a 2-core AVX2 VM.
DENSE_MIN_ROWS = 64


def available() -> bool:
    """fbgemm is in this torch build and the CPU has at least AVX2 (fbgemm's minimum)."""
    return ("fbgemm" in torch.backends.quantized.supported_engines
            and torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"))


def runs(weight_dtype: torch.dtype, act_dtype: torch.dtype, device: torch.device) -> bool:
    """Whether a dense layer of ``weight_dtype`` under ``act_dtype`` activations on
    ``device`` runs its few-row calls through fbgemm's fp16 kernel."""
    return (device.type == "cpu" and weight_dtype == torch.float16
            and act_dtype == torch.float32 and available())


def pack(weight: torch.Tensor) -> torch.ScriptObject:
    """fbgemm's packed copy of ``weight`` [N, K] (fp16 values; no bias: the layer adds it)."""
    return torch.ops.quantized.linear_prepack_fp16(weight.float(), None)


def matmul(x: torch.Tensor, packed: torch.ScriptObject) -> torch.Tensor:
    """x [M, K] float32 @ W.T -> [M, N] float32."""
    # the overload itself: the packet's call first scans its arguments for fake script
    # objects (a step's 121 calls for SmolLM2 at batch 1: 22.8 -> 22.2 ms, 2-core VM)
    return torch.ops.quantized.linear_dynamic_fp16.default(x.contiguous(), packed)
