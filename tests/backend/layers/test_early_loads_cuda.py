"""Loads issued before the wait for the previous kernel, on CUDA: the int4 one-token
GEMV's first weights (``quant_kernels.EARLY_WEIGHTS``; plain, ADDED and NORMED) and the
decode kernel's first K/V tile (``triton_attention.DECODE_EARLY``) give the same bits as
without them, call after call. CUDA only (the interpreter's checks, with the wait
simulated: ``test_quant_kernels.py``, ``test_triton_attention.py``)."""
from __future__ import annotations

import pytest
import torch

from backend.layers import quant_kernels as qk
from backend.layers import triton_attention as ta
from backend.layers.quantize import quantize_int4

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("n,k", [(12288, 4096), (4096, 4096), (22016, 4096), (4096, 11008),
                                 (1000, 1536)])
def test_early_weight_loads_give_the_same_bits(monkeypatch, n, k):
    gen = torch.Generator().manual_seed(n + k)
    g = quantize_int4(torch.randn(n, k, generator=gen) * 0.05, 128)
    packed = qk.pack_int4(g.codes).cuda()
    sm = qk.pack_scale_min(g.scale.bfloat16(), g.min.bfloat16()).cuda()
    x = torch.randn(1, k, generator=gen).to("cuda", torch.bfloat16)
    res = torch.randn(1, n, generator=gen).to("cuda", torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(k, generator=gen)).to("cuda", torch.bfloat16)
    ss = torch.full((4,), float(k), device="cuda")
    cfg = qk._words_config(128)
    out = {}
    for early in (False, True, True):
        monkeypatch.setattr(qk, "EARLY_WEIGHTS", early)
        got = (qk._int4_words(x, packed, sm, 128, cfg)[0],
               *qk._int4_words(x, packed, sm, 128, cfg, qk.ADDED, residual=res),
               qk._int4_words(x, packed, sm, 128, cfg, qk.NORMED, norm_w=nw, ss=ss,
                              eps=1e-5)[0])
        if early in out:
            assert all(torch.equal(a, b) for a, b in zip(got, out[early]))
        out[early] = got
    assert all(torch.equal(a, b) for a, b in zip(out[True], out[False]))
    ref = x.float() @ qk.dequantize_int4(packed, sm, 128).float().t()
    assert ((out[True][0].float() - ref).norm() / ref.norm()).item() < 1e-2


@pytest.mark.parametrize("batch", [1, 8, 64])
def test_early_decode_gives_the_same_bits(batch):
    """Llama-2-7B's heads over a bf16 cache, contexts of 530-600 tokens, the splits the
    engine's graphs use, launched with programmatic dependent launch."""
    gen = torch.Generator().manual_seed(batch)
    heads, hd, bs = 32, 128, 16
    lens = torch.randint(530, 601, (batch,), generator=gen, dtype=torch.int32)
    width = -(-int(lens.max()) // bs)
    blocks = torch.randperm(batch * width, generator=gen).view(batch, width).int()
    cache = (torch.randn(batch * width * bs, 2, heads, hd, generator=gen) * 0.5).to(
        "cuda", torch.bfloat16)
    q = torch.randn(batch, heads, hd, generator=gen).to("cuda", torch.bfloat16)
    splits = ta.decode_splits(batch, heads, None, q.device)
    args = (q, cache, None, blocks.cuda(), lens.cuda())
    outs = []
    for early in (False, True, True):
        out = torch.empty_like(q)
        ta.paged_decode(*args, out, hd ** -0.5, bs, "auto", splits, dependent_launch=True,
                        early=early)
        outs.append(out)
    assert torch.equal(outs[1], outs[2]) and torch.equal(outs[0], outs[1])
