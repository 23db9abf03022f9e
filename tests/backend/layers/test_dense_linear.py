"""Dense layers. On the CPU one bf16 row without a bias runs torch.mv (its GEMV read the
weight faster than F.linear's on the AVX-512 Xeon VM, with the same bits there); more
rows, a bias or another dtype run F.linear. On CUDA the flat eager loop binds mm(x, W.T)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.layers.linear import DenseLinear, Linear


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


def test_few_rows_fn_is_forward_on_the_cpu_and_conversions_move_the_generation() -> None:
    """On the CPU a dense layer's flat-loop call is its forward (mv, oneDNN, fbgemm choices
    are made there). A conversion replaces the weight's storage: the generation moves, so a
    bound view of the old weight (CUDA's mm) is not used again."""
    layer = DenseLinear.over(torch.randn(32, 16).bfloat16())
    assert layer.few_rows_fn() == (layer.forward, None)
    at = Linear.generation
    layer.float()
    assert Linear.generation > at


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_few_rows_fn_on_cuda_is_forward_bit_for_bit() -> None:
    """On CUDA a bf16 layer without a bias binds mm(x, W.T): F.linear's own call."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(4096, 512, device="cuda", generator=gen).bfloat16()
    layer = DenseLinear.over(w)
    fn, kind = layer.few_rows_fn()
    assert kind is None and fn != layer.forward
    for rows in (1, 8, 64, 600):
        x = torch.randn(rows, 512, device="cuda", generator=gen).bfloat16()
        assert torch.equal(fn(x), layer(x))
    biased = DenseLinear(64, 512, True, torch.device("cuda"), torch.bfloat16, torch.bfloat16)
    assert biased.few_rows_fn() == (biased.forward, None)
