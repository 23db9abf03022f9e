"""The int4 one-token GEMV with its first weight loads before the wait for the previous
kernel (``quant_kernels.EARLY_WEIGHTS``) on CUDA: the same bits as the cp.async-pipelined
loop, plain and with the residual added, on Llama-2-7B's shapes and a cut one, call after
call. CUDA only (the interpreter's check: ``test_quant_kernels.py``)."""
from __future__ import annotations

import pytest
import torch

from backend.layers import quant_kernels as qk
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
    cfg = qk._words_config(128)
    out = {}
    for early in (False, True, True):
        monkeypatch.setattr(qk, "EARLY_WEIGHTS", early)
        got = (qk._int4_words(x, packed, sm, 128, cfg)[0],
               *qk._int4_words(x, packed, sm, 128, cfg, qk.ADDED, residual=res))
        if early in out:
            assert all(torch.equal(a, b) for a, b in zip(got, out[early]))
        out[early] = got
    assert all(torch.equal(a, b) for a, b in zip(out[True], out[False]))
    ref = x.float() @ qk.dequantize_int4(packed, sm, 128).float().t()
    assert ((out[True][0].float() - ref).norm() / ref.norm()).item() < 1e-2
