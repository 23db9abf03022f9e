"""Dense layers on the CPU: one bf16 row without a bias runs torch.mv (its GEMV read the
weight faster than F.linear's on the AVX-512 Xeon VM, with the same bits there); more
rows, a bias or another dtype run F.linear."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from backend.layers.linear import DenseLinear


def test_one_bf16_row_runs_the_gemv_and_matches_f_linear(monkeypatch) -> None:
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(1536, 576, generator=gen) * 0.05).bfloat16()
    layer = DenseLinear.over(w)
    calls = []
    mv = torch.mv
    monkeypatch.setattr(torch, "mv", lambda *a: calls.append(1) or mv(*a))
    for rows, gemv in ((1, True), (2, False), (8, False)):
        calls.clear()
        x = torch.randn(rows, 576, generator=gen).bfloat16()
        y = layer(x)
        assert y.shape == (rows, 1536) and y.dtype == torch.bfloat16
        assert bool(calls) == gemv
        torch.testing.assert_close(y, F.linear(x, w), rtol=1e-2, atol=1e-2)
    calls.clear()
    x = torch.randn(1, 576, generator=gen)  # float32: F.linear
    torch.testing.assert_close(DenseLinear.over(w.float())(x), F.linear(x, w.float()))
    assert not calls
