"""Matmuls split along K (``backend.layers.splits``): the one-token GEMVs that add their
partials up in the kernel give the unsplit result on every call and leave the arrival
counters at zero, and the buffers' contract. Under the Triton interpreter on the CPU; on
CUDA the same."""
from __future__ import annotations

import pytest
import torch

from backend.layers import quant_kernels, splits
from backend.layers.quantize import quantize_int4, quantize_int8

pytestmark = pytest.mark.skipif(not quant_kernels.AVAILABLE, reason="needs triton (interpreter)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_gemvs_split_in_kernel_match_unsplit_and_reset_their_counters() -> None:
    g = torch.Generator().manual_seed(0)
    N, K, G = 48, 512, 32
    w = torch.randn(N, K, generator=g) * 0.05
    x = torch.randn(1, K, generator=g).to(DEVICE)
    q, s = quantize_int8(w)
    i4 = quantize_int4(w, G)
    q, s = q.to(DEVICE), s.to(DEVICE)
    packed = quant_kernels.pack_int4(i4.codes).to(DEVICE)
    sm = quant_kernels.pack_scale_min(i4.scale, i4.min).to(DEVICE)
    # 16 rows a program -> 3 tiles; PROGRAMS_PER_SM with SPLIT_GEMV splits K (up to 8 ways)
    cfg8 = dict(BLOCK_N=16, BLOCK_K=64, MAGIC=1, WORDS=1, PROGRAMS_PER_SM=4, SPLIT_GEMV=1,
                num_warps=4, num_stages=3)
    cfg4 = dict(BLOCK_N=16, BYTES=32, MAGIC=1, WORDS=1, PROGRAMS_PER_SM=4, SPLIT_GEMV=1,
                num_warps=4, num_stages=3)
    assert quant_kernels._gemv_grid(cfg8, N, K // 4, 16, x.device)[1] > 1  # it does split
    assert quant_kernels._gemv_grid(cfg4, N, K // 8, 8, x.device)[1] > 1
    want8 = x.float() @ (q.float() * s[:, None].float()).t()
    want4 = x.float() @ quant_kernels.dequantize_int4(packed, sm, G).float().t()
    for _ in range(3):  # a counter left non-zero would lose the next call's sum
        torch.testing.assert_close(quant_kernels.int8_matmul(x, q, s, cfg8).float(), want8,
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(quant_kernels.int4_matmul(x, packed, sm, G, cfg4)
                                   .float(), want4, atol=1e-4, rtol=1e-4)
        assert int(splits.counters(x.device).abs().sum()) == 0


def test_in_kernel_buffers() -> None:
    x = torch.zeros(1, 8, device=DEVICE)
    y, part, cnt = splits.added_in_kernel(x, 1, 40, 1, 3)
    assert part is y and cnt is y and y.shape == (1, 40)  # unsplit: nothing else
    y, part, cnt = splits.added_in_kernel(x, 1, 40, 4, 3)
    assert part.shape == (4, 1, 40) and part.dtype == torch.float32
    assert cnt is splits.counters(x.device) and cnt.dtype == torch.int32
    with pytest.raises(ValueError):
        splits.added_in_kernel(x, 1, 40, 2, splits.COUNTERS + 1)


def test_int4_stream_k_matches_the_reference_and_resets_its_counters() -> None:
    """Stream-K over more (tile, K step) units than programs: ranges that start and end
    inside tiles (500 rows: 32 tiles x 16 steps on 132 programs), the last row tile cut
    short, two row tiles of x (130 tokens), two groups a step; repeated calls give the
    same bits (the pieces are summed in program order) and leave the counters at zero."""
    g = torch.Generator().manual_seed(1)
    N, K, G = 500, 1024, 32
    w = torch.randn(N, K, generator=g) * 0.05
    i4 = quantize_int4(w, G)
    packed = quant_kernels.pack_int4(i4.codes).to(DEVICE)
    sm = quant_kernels.pack_scale_min(i4.scale, i4.min).to(DEVICE)
    ref = quant_kernels.dequantize_int4(packed, sm, G).float()
    for M, groups in ((20, 1), (130, 2)):
        cfg = dict(BLOCK_N=16, GROUPS=groups, MAGIC=3, SWAP=1, STREAM_K=1, STREAM_K_FROM=0,
                   num_warps=4, num_stages=3)
        x = torch.randn(M, K, generator=g).to(DEVICE)
        first = quant_kernels.int4_matmul(x, packed, sm, G, cfg)
        want = x.float() @ ref.t()
        if DEVICE == "cuda":  # fp32 tl.dot runs in tf32 there (the tile grid's error too)
            assert ((first.float() - want).abs().max() / want.abs().max()).item() < 2e-3
        else:
            torch.testing.assert_close(first.float(), want, atol=1e-4, rtol=1e-4)
        again = quant_kernels.int4_matmul(x, packed, sm, G, cfg)
        assert torch.equal(first, again)
        assert int(splits.counters(x.device).abs().sum()) == 0
