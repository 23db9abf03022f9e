"""fp8 (e4m3) linear layers: the weight and activation quantisers (the Triton row kernel
against the torch ops, bit for bit), the scaled matmul against its dequantised reference,
the one-token GEMV over the codes with each prologue, and the wiring (format, kernels,
shape checks, the engine's report)."""
from __future__ import annotations

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.layers import fp8_matmul, fused_ops, gemv
from backend.layers.gemv import ADD_NORM, NONE, NORM, SILU_MUL, Prologue
from backend.layers.linear import WeightFormat, make_linear
from backend.layers.quantize import dequantize_fp8, quantize_fp8
from tests.backend.layers.test_quant_linear import quantised_layer

CPU = torch.device("cpu")
FP8 = torch.float8_e4m3fn
needs_triton = pytest.mark.skipif(not gemv.AVAILABLE, reason="needs triton (interpreter)")


def _fp8_layer(w: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None = None):
    return quantised_layer("fp8", w, dtype, bias=bias)


def test_weight_quantiser_maps_each_rows_largest_value_to_448_and_rounds_to_nearest():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    w[3] = 0.0  # an all-zero row stays zero, with a finite scale
    codes, scale = quantize_fp8(w)
    assert codes.dtype == FP8 and scale.shape == (64,) and torch.isfinite(scale).all()
    top = codes.float().abs().amax(dim=1)
    assert (top[torch.arange(64) != 3] == 448).all() and top[3] == 0
    # round to nearest: within half a step of e4m3 (3 mantissa bits) of the scaled value
    scaled = w * (448 / w.abs().amax(dim=1, keepdim=True).clamp(min=1e-12))
    step = torch.exp2(torch.floor(torch.log2(scaled.abs().clamp(min=2**-6))) - 3)
    assert ((codes.float() - scaled).abs() <= step / 2 + 1e-6).all()
    rel = (dequantize_fp8(codes, scale) - w).norm() / w.norm()
    assert rel < 0.04


@needs_triton
@pytest.mark.parametrize("K", [64, 200, 1536])
def test_row_quantiser_kernel_matches_the_torch_ops_bit_for_bit(K):
    gen = torch.Generator().manual_seed(K)
    x = torch.randn(7, K + 8, generator=gen)[:, :K] * 3  # strided rows, as a view gives
    x[2] = 0.0
    x[4, :5] = torch.tensor([1e-9, -4.0, 2.25, 0.0, 448.0])  # tiny, ties and the top
    for dtype in (torch.float32, torch.bfloat16):
        xd = x.to(dtype)
        got_q, got_s = fp8_matmul.quantize_rows(xd)  # the Triton kernel (interpreter)
        amax = xd.float().abs().amax(dim=1, keepdim=True).clamp(min=1e-12)
        want_q = (xd.float() * (448 / amax)).to(FP8)
        assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
        torch.testing.assert_close(got_s, amax / 448, atol=0, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 5, 130])
def test_scaled_matmul_matches_its_dequantised_reference(dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 128, generator=gen) * 0.05
    b = torch.randn(96, generator=gen)
    layer = _fp8_layer(w, dtype, bias=b)
    assert layer.kernel == layer.prefill_kernel() == "torch._scaled_mm"
    x = torch.randn(rows, 128, generator=gen).to(dtype)
    xq, xs = fp8_matmul.quantize_rows(x)
    # what the tensor cores multiply: both operands' codes times their scales
    ref = (xq.float() * xs) @ layer.dequantized().t() + b.to(dtype).float()
    got = layer(x).float()
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, ref, atol=tol * ref.abs().max().item(), rtol=0)
    # and against the float weights and activations: e4m3's own error, a few per cent
    exact = x.float() @ w.t() + b.to(dtype).float()
    assert ((got - exact).norm() / exact.norm()) < 0.06


@needs_triton
@pytest.mark.parametrize("kind", [NONE, NORM, ADD_NORM, SILU_MUL])
def test_one_token_gemv_over_fp8_codes_matches_the_unfused_steps(kind):
    """Weight-only at one token: the activation stays in the model dtype (no row quantiser),
    the codes are widened in the kernel and each row scaled at the end."""
    N, K = 48, 96
    gen = torch.Generator().manual_seed(kind)
    w = torch.randn(N, K, generator=gen) * 0.1
    layer = _fp8_layer(w, torch.float32, bias=torch.randn(N, generator=gen))
    x = torch.randn(1, 2 * K if kind == SILU_MUL else K, generator=gen) * 2
    residual = torch.randn(1, K, generator=gen) if kind == ADD_NORM else None
    norm_w = torch.rand(K, generator=gen) + 0.5
    prologue = Prologue(kind, residual, norm_w if kind in (NORM, ADD_NORM) else None, 1e-5)
    a, carried_want = x, None
    if kind == SILU_MUL:
        a = fused_ops.silu_mul_eager(x)
    elif kind in (NORM, ADD_NORM):
        a, carried_want = fused_ops.add_rms_norm_eager(x, residual, norm_w, 1e-5)
    want = a @ layer.dequantized().t() + layer.bias
    y, carried = layer.one_token(x, prologue)
    torch.testing.assert_close(y, want, atol=1e-4, rtol=1e-4)
    if kind == ADD_NORM:
        assert torch.equal(carried, carried_want)
    assert layer.one_token_kernel(True) == "triton-gemv-fp8"
    assert layer.one_token_kernel(False) == "torch._scaled_mm"


def test_shapes_the_fp8_matmul_cannot_take_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="multiples of 16"):
        make_linear(WeightFormat.parse("fp8"), 100, 64, False, CPU, torch.float32)
    assert WeightFormat.parse("fp8").describe(torch.bfloat16) == "fp8"


def test_engine_serves_fp8_weights_and_reports_them(smollm2_source):
    cfg = EngineConfig(dtype="float32", weights_dtype="fp8", weights_scaling="none",
                       kv_cache_memory_gib=0.02, max_model_len=256)
    engine = LLMEngine(cfg, smollm2_source)
    stats = engine.stats()
    assert stats.weights_format == "fp8" and stats.linear_kernel == "torch._scaled_mm"
    dense = LLMEngine(EngineConfig(dtype="float32", weights_dtype="fp32",
                                   kv_cache_memory_gib=0.02, max_model_len=256), smollm2_source)
    text = ("The gateway timestamps the first and last token of every request and exports "
            "latency metrics per model. Time to first token is measured from the moment the "
            "request arrives to the first delta that carries content.")
    tokens = smollm2_source.tokenizer.encode(text)
    got, want = engine.score(tokens), dense.score(tokens)
    # the same model within fp8's rounding: most next-token choices agree (about 85-90 %
    # on this 135M model, docs/BENCHMARKS.md; a layer wired to wrong rows agrees on ~none)
    agree = (got.argmax(-1) == want.argmax(-1)).float().mean().item()
    assert agree >= 0.75, agree


@needs_triton
@pytest.mark.parametrize("kind", [NORM, ADD_NORM, SILU_MUL])
def test_step_kernels_that_end_in_fp8_give_the_quantisers_bits(kind):
    """The norm / SiLU·mul kernels writing codes directly: the same codes, scales and
    residual as their model-dtype output quantised by the row kernel afterwards."""
    gen = torch.Generator().manual_seed(10 + kind)
    T, K = 5, 96
    x = (torch.randn(T, 2 * K if kind == SILU_MUL else K, generator=gen) * 3).to(torch.bfloat16)
    residual = torch.randn(T, K, generator=gen).to(torch.bfloat16) if kind == ADD_NORM else None
    w = (torch.rand(K, generator=gen) + 0.5).to(torch.bfloat16)
    if kind == SILU_MUL:
        want_q, want_s = fp8_matmul.quantize_rows(fused_ops.silu_mul_triton(x))
        got_q, got_s = fused_ops.silu_mul_fp8(x)
    else:
        normed, want_res = fused_ops.add_rms_norm_triton(x, residual, w, 1e-5)
        want_q, want_s = fp8_matmul.quantize_rows(normed)
        got_q, got_s, got_res = fused_ops.add_rms_norm_fp8(x, residual, w, 1e-5)
        assert torch.equal(got_res, want_res)
    assert got_q.dtype == FP8
    assert torch.equal(got_q.view(torch.uint8), want_q.view(torch.uint8))
    assert torch.equal(got_s, want_s)


@needs_triton
@pytest.mark.parametrize("kind", [NONE, ADD_NORM, SILU_MUL])
def test_matmul_through_the_triton_step_ops_matches_the_eager_path(kind):
    """``linear.matmul`` on an fp8 layer at a few tokens: the Triton ops hand over codes
    (norm, SiLU·mul) or the layer quantises (no prologue); the eager ops run the prologue
    in torch and the layer quantises. Same result within the rounding of the norm."""
    from backend.layers.linear import matmul
    N, K, T = 48, 96, 3
    gen = torch.Generator().manual_seed(20 + kind)
    layer = _fp8_layer(torch.randn(N, K, generator=gen) * 0.1, torch.float32)
    x = torch.randn(T, 2 * K if kind == SILU_MUL else K, generator=gen)
    residual = torch.randn(T, K, generator=gen) if kind == ADD_NORM else None
    norm_w = torch.rand(K, generator=gen) + 0.5
    prologue = Prologue(kind, residual, norm_w if kind == ADD_NORM else None, 1e-5)
    y_t, res_t = matmul(layer, x, prologue, fused_ops.TRITON)
    y_e, res_e = matmul(layer, x, prologue, fused_ops.EAGER)
    torch.testing.assert_close(y_t, y_e, atol=2e-3 * y_e.abs().max().item(), rtol=0)
    if kind == ADD_NORM:
        torch.testing.assert_close(res_t, res_e)
