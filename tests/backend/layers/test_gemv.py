"""One-token GEMVs with their prologue fused in (``backend.layers.gemv``, and the int8
word-wise GEMV's twin in ``quant_kernels``) against the unfused torch path: the eager norm /
SiLU·mul, then the matmul. Under the Triton interpreter on the CPU; on CUDA the same."""
from __future__ import annotations

import pytest
import torch

from backend.layers import fused_ops, gemv, quant_kernels
from backend.layers.gemv import ADD_NORM, NONE, NORM, SILU_MUL, Prologue
from backend.layers.linear import DenseLinear, matmul
from backend.layers.quantize import quantize_int8

pytestmark = pytest.mark.skipif(not gemv.AVAILABLE, reason="needs triton (interpreter)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5
# tiles that do and do not divide (N, K); pipelined and not
CONFIGS = [dict(BLOCK_N=8, BLOCK_K=32, STAGES=1, num_warps=4),
           dict(BLOCK_N=16, BLOCK_K=64, STAGES=3, num_warps=4),
           dict(BLOCK_N=4, BLOCK_K=128, STAGES=2, num_warps=2)]


def _rand(*shape: int, dtype: torch.dtype = torch.float32, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


def _unfused(kind: int, x, residual, norm_w, weight_t, bias=None):
    """(y, residual) by the eager ops, then a float32 matmul with weight_t [K, N]."""
    carried = None
    if kind == SILU_MUL:
        x = fused_ops.silu_mul_eager(x)
    elif kind in (NORM, ADD_NORM):
        x, carried = fused_ops.add_rms_norm_eager(x, residual, norm_w, EPS)
    y = x.float() @ weight_t
    return (y if bias is None else y + bias.float()), carried


def _inputs(kind: int, K: int, dtype: torch.dtype):
    x = _rand(1, 2 * K if kind == SILU_MUL else K, dtype=dtype, seed=1) * 2
    residual = _rand(1, K, dtype=dtype, seed=2) if kind == ADD_NORM else None
    norm_w = (_rand(K, dtype=dtype, seed=3) * 0.5 + 1).to(dtype)
    prologue = Prologue(kind, residual, norm_w if kind in (NORM, ADD_NORM) else None, EPS)
    return x, residual, norm_w, prologue


@pytest.mark.parametrize("kind", [NONE, NORM, ADD_NORM, SILU_MUL])
@pytest.mark.parametrize("N, K", [(40, 96), (64, 256)])
def test_gemv_with_each_prologue_matches_the_unfused_steps(kind, N, K) -> None:
    x, residual, norm_w, prologue = _inputs(kind, K, torch.float32)
    w = _rand(N, K, seed=4) * 0.1
    bias = _rand(N, seed=5)
    want, want_res = _unfused(kind, x, residual, norm_w, w.t(), bias)
    for cfg in CONFIGS:
        y, carried = gemv.gemv(x, w, bias, prologue, cfg)
        torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-4)
        if kind == ADD_NORM:
            assert torch.equal(carried, want_res)  # x + residual, written once
        elif kind == NORM:
            assert carried is x
        else:
            assert carried is None


def test_gemv_in_bf16_within_its_rounding() -> None:
    N, K = 48, 160
    x, residual, norm_w, prologue = _inputs(ADD_NORM, K, torch.bfloat16)
    w = (_rand(N, K, seed=6) * 0.1).bfloat16()
    want, want_res = _unfused(ADD_NORM, x, residual, norm_w, w.float().t())
    y, carried = gemv.gemv(x, w, None, prologue, CONFIGS[1])
    assert y.dtype == torch.bfloat16
    assert ((y.float() - want).abs().max() / want.abs().max()).item() < 2e-2
    torch.testing.assert_close(carried, want_res, atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("kind", [NONE, NORM, ADD_NORM, SILU_MUL])
def test_int8_gemv_with_each_prologue_matches_the_unfused_steps(kind) -> None:
    N, K = 48, 256
    x, residual, norm_w, prologue = _inputs(kind, K, torch.float32)
    q, s = quantize_int8(_rand(N, K, seed=7) * 0.1)
    want, want_res = _unfused(kind, x, residual, norm_w, (q.float() * s[:, None]).t())
    # x read per byte (four strided loads) and as [words, 4] (XVEC), tiles that do and do
    # not divide the 64 words of a row
    for cfg in (dict(BLOCK_N=8, BLOCK_K=64, MAGIC=1, WORDS=1, num_warps=4, num_stages=3),
                dict(BLOCK_N=16, BLOCK_K=128, MAGIC=1, WORDS=1, STAGES=2, num_warps=4,
                     num_stages=3),
                dict(BLOCK_N=16, BLOCK_K=64, MAGIC=1, WORDS=1, XVEC=1, num_warps=4,
                     num_stages=3),
                dict(BLOCK_N=32, BLOCK_K=512, MAGIC=1, WORDS=1, XVEC=1,
                     STAGES=2, num_warps=4, num_stages=3)):
        y, carried = quant_kernels.int8_gemv_fused(x, q, s, prologue, cfg)
        torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-4)
        if kind == ADD_NORM:
            assert torch.equal(carried, want_res)


def test_int8_gemv_leaves_split_rows_to_the_unfused_steps() -> None:
    """A config that splits K cannot finish a norm in one program: no fused result."""
    x, _, norm_w, _ = _inputs(NORM, 256, torch.float32)
    q, s = quantize_int8(_rand(16, 256, seed=8))
    split = dict(BLOCK_N=16, BLOCK_K=32, MAGIC=1, WORDS=1, PROGRAMS_PER_SM=4, SPLIT_GEMV=1,
                 num_warps=4, num_stages=3)
    assert quant_kernels.int8_gemv_fused(x, q, s, Prologue(NORM, None, norm_w, EPS),
                                         split) is None


@pytest.mark.parametrize("tokens", [1, 3])
def test_matmul_fuses_one_token_only_where_the_step_ops_ask(tokens, monkeypatch) -> None:
    """``matmul`` with the Triton step ops takes the fused kernel at one token and the
    separate kernels otherwise; eager ops never fuse. Every way gives the same numbers."""
    N, K = 40, 96
    layer = DenseLinear(N, K, False, torch.device(DEVICE), torch.float32, torch.float32)
    layer.weight.copy_(_rand(N, K, seed=9) * 0.1)
    x = _rand(tokens, K, seed=10)
    residual = _rand(tokens, K, seed=11)
    norm_w = _rand(K, seed=12) + 1
    calls = []
    real = gemv.gemv
    monkeypatch.setattr(gemv, "gemv", lambda *a, **k: calls.append(1) or real(*a, **k))
    want, want_res = _unfused(ADD_NORM, x, residual, norm_w, layer.weight.t())
    for ops in (fused_ops.EAGER, fused_ops.TRITON):
        y, carried = matmul(layer, x, Prologue(ADD_NORM, residual, norm_w, EPS), ops)
        torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(carried, want_res)
    assert len(calls) == (1 if tokens == 1 else 0)
    # what /health reports for one-token steps, with and without the fusing step ops
    assert (layer.one_token_kernel(True), layer.one_token_kernel(False)) == (
        "triton-gemv", "dense")
