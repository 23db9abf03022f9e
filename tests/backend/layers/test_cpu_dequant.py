"""The CPU many-token path of the packed formats (dequantise into scratch, dense matmul):
the same results as the packed kernels and the dequantised reference on both sides of the
row threshold, in one block of output rows and in several, and the packed int4 layout read
back exactly."""
from __future__ import annotations

import pytest
import torch

from backend.layers import cpu_dequant
from backend.layers.linear import LinearRows, WeightFormat, make_linear

CPU = torch.device("cpu")


def _layer(kind: str, n: int, k: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=gen) * 0.05
    layer = make_linear(WeightFormat(kind, None, 32), n, k, True, CPU, dtype)
    LinearRows(layer).load(w)
    layer.bias.copy_(torch.randn(n, generator=gen))
    return layer


def test_int4_packed_layout_reads_back_exactly():
    codes = torch.randint(0, 16, (192, 96), generator=torch.Generator().manual_seed(0),
                          dtype=torch.int32)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)
    assert cpu_dequant.int4_layout_ok(packed, codes)
    torch.testing.assert_close(cpu_dequant.int4_unpack(packed, 192, 96), codes.to(torch.uint8))
    # Rows not in whole blocks of the packing (64 rows with AVX-512, else 32): the layer
    # keeps the packed kernel for every call.
    block = cpu_dequant.int4_block_n()
    assert block in (64, 32)
    assert not _layer("int4", {64: 96, 32: 80}[block], 64, torch.float32, 0).dense_from_packed


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("chunk", [1 << 22, 64 * 64], ids=["one-block", "blocks"])
def test_dispatch_matches_packed_kernel_and_reference(kind, dtype, chunk, monkeypatch):
    monkeypatch.setattr(cpu_dequant, "CHUNK_ELEMENTS", chunk)
    layer = _layer(kind, 320, 128, dtype, seed=1)
    assert kind == "int8" or layer.dense_from_packed
    calls = []
    dense_fn = getattr(cpu_dequant, f"{kind}_matmul")
    monkeypatch.setattr(cpu_dequant, f"{kind}_matmul",
                        lambda *a: calls.append(a[0].shape[0]) or dense_fn(*a))
    threshold = cpu_dequant.DENSE_MIN_ROWS[kind]
    ref_w = layer.dequantized()  # [N, K] the packed kernel's own weights
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    for rows in (1, threshold - 1, threshold, 3 * threshold + 5):
        x = torch.randn(rows, 128, generator=torch.Generator().manual_seed(rows)).to(dtype)
        got = layer(x).float()
        ref = x.float() @ ref_w.t() + layer.bias.float()
        scale = ref.abs().max().item()
        torch.testing.assert_close(got, ref, atol=tol * scale, rtol=0)
        if kind == "int8":
            packed = torch._weight_int8pack_mm(x, layer.q, layer.scale) + layer.bias
        else:
            packed = torch._weight_int4pack_mm_for_cpu(x, layer.packed, 32,
                                                       layer.scale_zero) + layer.bias
        torch.testing.assert_close(got, packed.float(), atol=tol * scale, rtol=0)
    assert calls == [threshold, 3 * threshold + 5]


def test_scratch_from_inference_mode_serves_callers_outside_it():
    """The per-thread scratch first made under torch.inference_mode (as the engine runs)
    must still be writable by a later call outside it (a tool or test in the same
    process)."""
    gen = torch.Generator().manual_seed(4)
    q = torch.randint(-127, 128, (48, 64), generator=gen, dtype=torch.int8)
    scale = torch.rand(48, generator=gen) + 0.5
    x = torch.randn(3, 64, generator=gen)
    ref = x @ (q.float() * scale[:, None]).t()
    cpu_dequant._local.__dict__.pop("bufs", None)  # the next call makes the buffer
    with torch.inference_mode():
        inside = cpu_dequant.int8_matmul(x, q, scale)
    outside = cpu_dequant.int8_matmul(x, q, scale)
    torch.testing.assert_close(inside, ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(outside, inside)
