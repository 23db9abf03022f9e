"""The one-pass Triton dequantisers for many-token calls on CUDA, run by Triton's
interpreter on the CPU: the same bits as the torch expressions they replace, for each
weight dtype, tiles that do not divide the shape, and groups wider than a tile. The
interpreter narrows float32 to bfloat16 by truncation where the GPU rounds to nearest, so
bfloat16 is held to one unit in the last place here (bit-exact on the GPU:
``docs/BENCHMARKS.md``)."""
from __future__ import annotations

import pytest
import torch

from backend.layers import gpu_dequant, quant_kernels
from backend.layers.quantize import quantize_int4, quantize_int8

pytestmark = pytest.mark.skipif(not gpu_dequant._kernels(torch.device("cpu")),
                                reason="needs triton (interpreter)")


def same(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor) -> bool:
    """Equal bits; under the interpreter in bfloat16, within one unit of each of the two
    roundings (of the product and of the sum, both of at most ``magnitude``)."""
    if got.dtype != torch.bfloat16 or got.device.type == "cuda":
        return torch.equal(got, want)
    ulp = magnitude.float().abs() * 2.0 ** -7  # bf16: 8 significant bits
    return bool(((got.float() - want.float()).abs() <= 2 * ulp).all())



@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("N,K,G", [(20, 256, 32), (9, 1280, 128), (5, 2048, 1024)])
def test_int4_dense_matches_the_torch_dequantiser_bit_for_bit(dtype, N, K, G) -> None:
    # (5, 2048, 1024): a group is wider than a tile's 512 bytes: one scale load per weight
    g = quantize_int4(torch.randn(N, K, generator=torch.Generator().manual_seed(N)), G)
    packed = quant_kernels.pack_int4(g.codes)
    scale, lo = g.scale.to(dtype), g.min.to(dtype)
    sm = quant_kernels.pack_scale_min(scale, lo)
    got = gpu_dequant.int4_dense(packed, sm, G)
    want = quant_kernels.dequantize_int4(packed, sm, G)
    assert got.dtype == dtype and got.shape == (N, K)
    codes = torch.cat((packed & 15, packed >> 4), dim=1).float().view(N, K // G, G)
    magnitude = (codes * scale.float().abs().unsqueeze(-1) + lo.float().abs().unsqueeze(-1))
    assert same(got, want, magnitude.view(N, K))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_int8_dense_matches_the_torch_expression_bit_for_bit(dtype) -> None:
    q, s = quantize_int8(torch.randn(11, 700, generator=torch.Generator().manual_seed(3)))
    s = s.to(dtype)
    got = gpu_dequant.int8_dense(q, s, dtype)
    want = q.to(dtype) * s.unsqueeze(1)
    assert got.dtype == dtype and same(got, want, want)
