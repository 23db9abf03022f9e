"""The CUDA Triton kernels, run by Triton's interpreter on the CPU (tiny shapes): every GEMV
and GEMM variant for int8 and int4 against the dequantised reference (default configs and
the alternatives ``benchmarks.quant_sweep`` times), and the int4 packing."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from backend.layers import quant_kernels
from backend.layers.quantize import quantize_int4

pytest.importorskip("triton")

_CHECK = textwrap.dedent("""
    import torch
    from backend.layers import quant_kernels as qk
    from backend.layers.quantize import quantize_int4, quantize_int8
    assert qk.AVAILABLE
    gen = torch.Generator().manual_seed(0)

    def close(got, ref):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)

    # int8: GEMV with and without the exponent trick, tiles that do and do not divide the
    # shape; GEMM as x W.T and W x.T, unsplit, split in two / three (uneven) and auto.
    gemv8 = [dict(BLOCK_N=bn, BLOCK_K=bk, MAGIC=m, num_warps=4, num_stages=3)
             for bn, bk, m in ((4, 64, 1), (16, 128, 0), (8, 256, 1))]
    gemv8 += [dict(BLOCK_N=bn, BLOCK_K=bk, MAGIC=1, WORDS=1, num_warps=4, num_stages=3)
              for bn, bk in ((4, 64), (16, 128), (8, 256))]
    gemv8 += [dict(BLOCK_N=16, BLOCK_K=64, MAGIC=1, WORDS=1, PROGRAMS_PER_SM=1,
                   num_warps=4, num_stages=3),
              dict(BLOCK_N=16, BLOCK_K=32, MAGIC=1, WORDS=1, PROGRAMS_PER_SM=1, SPLIT_GEMV=1,
                   STAGES=2, num_warps=4, num_stages=3)]
    gemm8 = [dict(BLOCK_N=16, BLOCK_K=bk, SPLIT_K=sk, SWAP=sw, num_warps=4, num_stages=3)
             for bk, sk, sw in ((32, 1, 0), (64, 2, 1), (32, 0, 0), (64, 3, 1))]
    # int4: the GEMV (both decodings), the GEMM with every MAGIC, both orientations, splits.
    gemv4 = [dict(BLOCK_N=bn, BYTES=by, MAGIC=m, num_warps=4, num_stages=3)
             for bn, by, m in ((4, 64, 1), (8, 32, 0), (16, 128, 1), (2, 256, 1))]
    # the word-wise GEMV (subnormal decoding): tiles that do and do not divide the shape
    gemv4 += [dict(BLOCK_N=bn, BYTES=by, MAGIC=1, WORDS=1, num_warps=4, num_stages=3)
              for bn, by in ((4, 64), (8, 128), (16, 32))]
    # rows per program halved until the grid fills 132 multiprocessors twice: 48 rows -> 1
    gemv4 += [dict(BLOCK_N=16, BYTES=64, MAGIC=1, WORDS=1, PROGRAMS_PER_SM=2, num_warps=4,
                   num_stages=3),
              # or K split (up to 8 ways) with fp32 partial sums; pipelined loads
              dict(BLOCK_N=16, BYTES=32, MAGIC=1, WORDS=1, PROGRAMS_PER_SM=2, SPLIT_GEMV=1,
                   STAGES=3, num_warps=4, num_stages=3)]
    gemm4 = [dict(BLOCK_N=16, GROUPS=gr, SPLIT_K=sk, MAGIC=m, SWAP=sw, num_warps=4,
                  num_stages=3)
             for gr, sk, m, sw in ((1, 1, 0, 0), (2, 2, 3, 1), (1, 0, 2, 1), (2, 3, 0, 1))]
    # stream-K: every tile cut into pieces (fewer units than programs), one or two groups
    # a step
    gemm4 += [dict(BLOCK_N=16, GROUPS=gr, MAGIC=m, SWAP=1, STREAM_K=2, STREAM_K_FROM=0,
                   num_warps=4, num_stages=3) for gr, m in ((1, 3), (2, 0))]
    for N, K, G in ((48, 256, 32), (40, 192, 32), (64, 512, 64), (32, 512, 128)):
        w = torch.randn(N, K, generator=gen) * 0.1
        q, s = quantize_int8(w)
        g = quantize_int4(w, G)
        packed = qk.pack_int4(g.codes)
        ref8 = q.float() * s[:, None]
        ref4 = g.dequantize()
        for M in (1, 3, 20):
            x = torch.randn(M, K, generator=gen)
            for cfg in [None] + gemm8 + (gemv8 if M == 1 else []):
                close(qk.int8_matmul(x, q, s, cfg), x @ ref8.t())
            for cfg in [None] + gemm4 + (gemv4 if M == 1 else []):
                close(qk.int4_matmul(x, packed, qk.pack_scale_min(g.scale, g.min), G, cfg),
                      x @ ref4.t())
    # bf16 activations and scales (the decoding's bit tricks in the model dtype; the
    # word-wise GEMV then reads scales and x as 8-byte words): within bf16 rounding of the
    # output, on tiles that do and do not divide the shape, with the default configs
    words4 = [dict(BLOCK_N=16, BYTES=128, MAGIC=1, WORDS=1, STAGES=st, PROGRAMS_PER_SM=4,
                   SPLIT_GEMV=1, num_warps=2, num_stages=3) for st in (1, 3)]
    for N, K, G in ((64, 512, 32), (40, 1024, 128), (64, 768, 128)):
        g = quantize_int4(torch.randn(N, K, generator=gen) * 0.05, G)
        packed = qk.pack_int4(g.codes)
        sm = qk.pack_scale_min(g.scale.bfloat16(), g.min.bfloat16())
        x = torch.randn(1, K, generator=gen).bfloat16()
        ref = x.float() @ qk.dequantize_int4(packed, sm, G).float().t()
        for cfg in [None] + gemv4 + words4:
            y = qk.int4_matmul(x, packed, sm, G, cfg).float()
            assert ((y - ref).abs().max() / ref.abs().max()).item() < 2e-2, (N, K, G, cfg)
    # the first two steps' codes and records loaded before the wait for the previous kernel
    # and the loop pipelined by hand (EARLY_WEIGHTS, bf16 only): the same bits as the
    # cp.async loop, plain, with the residual added and normed, at 1, 2, 3 and 12 steps a
    # program, split and unsplit, whole and cut row blocks
    early_cfg = dict(words4[1], BLOCK_N=16)
    for N, K, G, cfg in ((32, 256, 128, None), (64, 1024, 128, early_cfg),
                         (40, 1536, 128, dict(early_cfg, PROGRAMS_PER_SM=1)),
                         (48, 768, 32, dict(early_cfg, BYTES=32, SPLIT_GEMV=0))):
        g = quantize_int4(torch.randn(N, K, generator=gen) * 0.05, G)
        packed = qk.pack_int4(g.codes)
        sm = qk.pack_scale_min(g.scale.bfloat16(), g.min.bfloat16())
        x = torch.randn(1, K, generator=gen).bfloat16()
        res = torch.randn(1, N, generator=gen).bfloat16()
        nw = (1 + 0.1 * torch.randn(K, generator=gen)).bfloat16()
        ss = torch.rand(3, generator=gen) * K
        cfg = cfg or qk._words_config(G)

        def calls():
            return (qk._int4_words(x, packed, sm, G, cfg)[0],
                    *qk._int4_words(x, packed, sm, G, cfg, qk.ADDED, residual=res),
                    qk._int4_words(x, packed, sm, G, cfg, qk.NORMED, norm_w=nw, ss=ss,
                                   eps=1e-5)[0])

        got = {}
        for early in (False, True):
            qk.EARLY_WEIGHTS = early
            got[early] = calls()
        assert all(torch.equal(a, b) for a, b in zip(got[True], got[False])), (N, K, G)
        # x read only after the wait: here x holds its values from the wait until the
        # program releases the next kernel, NaN before and after
        good = x.clone()

        def settle(_pdl=None):
            x.copy_(good)

        def spoil(_pdl=None):
            x.fill_(float("nan"))

        waits = qk.pdl_wait, qk.pdl_release
        qk.pdl_wait, qk.pdl_release = settle, spoil
        spoil()
        early = calls()
        qk.pdl_wait, qk.pdl_release = waits
        x.copy_(good)
        assert all(torch.equal(a, b) for a, b in zip(early, got[False])), (N, K, G)
        qk.EARLY_WEIGHTS = False
    # the norm split between two word-wise GEMVs (fp32: the interpreter's bf16 casts
    # truncate): ADDED writes the matmul + residual and its sums of squares by row block,
    # NORMED takes them for rms_norm(x) * w; split and unsplit grids, whole and cut tiles
    split_cfg = dict(BLOCK_N=16, BYTES=128, MAGIC=1, WORDS=1, STAGES=1, PROGRAMS_PER_SM=4,
                     SPLIT_GEMV=1, num_warps=2, num_stages=3)
    for N, K, G, cfg in ((256, 512, 128, None), (320, 1024, 128, split_cfg),
                         (192, 256, 32, dict(split_cfg, BYTES=32))):
        g = quantize_int4(torch.randn(N, K, generator=gen) * 0.05, G)
        packed, sm = qk.pack_int4(g.codes), qk.pack_scale_min(g.scale, g.min)
        cfg = cfg or qk._words_config(G)
        x, res = torch.randn(1, K, generator=gen), torch.randn(1, N, generator=gen)
        h, ss = qk._int4_words(x, packed, sm, G, cfg, qk.ADDED, residual=res)
        assert torch.equal(h, qk.int4_matmul(x, packed, sm, G, cfg) + res), (N, K, cfg)
        close(ss.sum(), h.pow(2).sum())
        M2 = 64
        g2 = quantize_int4(torch.randn(M2, N, generator=gen) * 0.05, 32)
        p2, sm2 = qk.pack_int4(g2.codes), qk.pack_scale_min(g2.scale, g2.min)
        nw = 1 + 0.1 * torch.randn(N, generator=gen)
        z = qk._int4_words(h, p2, sm2, 32, dict(split_cfg, BYTES=32), qk.NORMED, norm_w=nw,
                           ss=ss, eps=1e-5)[0]
        xn = h * torch.rsqrt(h.pow(2).mean() + 1e-5) * nw
        close(z, xn @ g2.dequantize().t())
        # bf16: x, the norm's weight and the records read as 8-byte words
        sm2b = qk.pack_scale_min(g2.scale.bfloat16(), g2.min.bfloat16())
        zb = qk._int4_words(h.bfloat16(), p2, sm2b, 32, dict(split_cfg, BYTES=32), qk.NORMED,
                            norm_w=nw.bfloat16(), ss=ss, eps=1e-5)[0].float()
        ref = xn @ qk.dequantize_int4(p2, sm2b, 32).float().t()
        assert ((zb - ref).norm() / ref.norm()).item() < 2e-2, (N, K, cfg)
    print("ok")
""")


def test_triton_kernels_match_reference_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", _CHECK], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_int4_packing_round_trips():
    g = quantize_int4(torch.randn(8, 64), 32)
    packed = quant_kernels.pack_int4(g.codes)
    assert packed.shape == (8, 32) and packed.dtype == torch.uint8
    sm = quant_kernels.pack_scale_min(g.scale, g.min)
    assert sm.shape == (8, 1, 4)  # 64 columns: one group of each row half
    back = quant_kernels.dequantize_int4(packed, sm, 32)
    torch.testing.assert_close(back, g.dequantize())
    for got, want in zip(quant_kernels.unpack_scale_min(sm), (g.scale, g.min)):
        assert torch.equal(got, want)
    odd = quantize_int4(torch.randn(8, 96), 32)  # three groups: one would straddle the halves
    with pytest.raises(ValueError, match="even number"):
        quant_kernels.pack_scale_min(odd.scale, odd.min)


def test_gemv_grid_fills_the_multiprocessors():
    grid = quant_kernels._gemv_grid
    cfg = dict(BLOCK_N=16, PROGRAMS_PER_SM=2)
    cpu = torch.device("cpu")  # counted as 132 multiprocessors
    assert grid(cfg, 12288, 1024, 128, cpu) == (16, 1, 1024)  # 768 programs
    assert grid(cfg, 4096, 1024, 128, cpu) == (8, 1, 1024)  # 16 rows: 256 < 264 programs
    assert grid(dict(BLOCK_N=16), 64, 1024, 128, cpu) == (16, 1, 1024)  # no minimum
    split = dict(cfg, SPLIT_GEMV=1)
    assert grid(split, 4096, 1024, 128, cpu) == (16, 2, 512)  # 256 rows x 2 splits
    assert grid(split, 64, 1024, 128, cpu) == (16, 4, 256)  # >= 2 steps per split
    assert grid(split, 64, 1000, 128, cpu) == (16, 4, 256)  # the last split shorter


def test_int4_kernel_support_and_group_override():
    assert quant_kernels.int4_supported(4096, 32) and quant_kernels.int4_supported(11008, 128)
    assert not quant_kernels.int4_supported(4096, 48)  # not a power of two
    assert not quant_kernels.int4_supported(64, 8)  # under 16 bytes per group
    assert not quant_kernels.int4_supported(192, 64)  # 64 does not divide the half width 96
    # per group size, a table for every bucket overrides the shared one
    for G in (32, 128):
        assert set(quant_kernels.CONFIGS[f"int4-g{G}"]) == {1, 16, 32, 64, 128}
    assert quant_kernels.CONFIGS["int4-g128"][1]["SPLIT_GEMV"]
    assert "WORDS" not in quant_kernels.CONFIGS["int4-g32"][1]
