"""Few-token matmuls (``backend.layers.skinny_gemm``) against a float32 reference, the choice
of where they run, and ``matmul``'s routing through them. Under the Triton interpreter on
the CPU; on CUDA the same."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from backend.layers import fused_ops, pdl, skinny_gemm
from backend.layers.gemv import ADD_NORM, SILU_MUL, Prologue
from backend.layers.linear import DenseLinear, matmul

pytestmark = pytest.mark.skipif(not skinny_gemm.AVAILABLE, reason="needs triton (interpreter)")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EPS = 1e-5
# tiles that do and do not divide (N, K), both operand orders, K split 1 / 2 / 3 ways, with
# pointer loads and with tensor descriptors (TMA: edges zero-filled by the copy)
CONFIGS = [dict(BLOCK_N=16, BLOCK_K=32, STAGES=2, SPLIT=1, SWAP=0, num_warps=4),
           dict(BLOCK_N=32, BLOCK_K=64, STAGES=1, SPLIT=3, SWAP=1, num_warps=4),
           dict(BLOCK_N=64, BLOCK_K=32, STAGES=3, SPLIT=2, SWAP=1, num_warps=4),
           dict(BLOCK_N=16, BLOCK_K=32, STAGES=2, SPLIT=3, SWAP=1, TMA=1, num_warps=4),
           dict(BLOCK_N=32, BLOCK_K=64, STAGES=3, SPLIT=1, SWAP=0, TMA=1, num_warps=4)]


def _rand(*shape: int, dtype: torch.dtype = torch.bfloat16, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


@pytest.mark.parametrize("M, N, K", [(2, 48, 96), (16, 64, 256), (17, 40, 64), (33, 64, 128)])
def test_skinny_gemm_matches_a_float32_matmul(M, N, K) -> None:
    x = _rand(M, K, seed=1)
    w = _rand(N, K, seed=2) * 0.1
    bias = _rand(N, seed=3)
    want = x.float() @ w.float().t() + bias.float()
    for cfg in CONFIGS:
        y = skinny_gemm.skinny_gemm(x, w, bias, cfg)
        assert y.shape == (M, N) and y.dtype == torch.bfloat16
        # the products are exact in fp32; the one rounding is the output's to bf16
        torch.testing.assert_close(y.float(), want, atol=2e-2, rtol=1e-2)
        y = skinny_gemm.skinny_gemm(x, w, None, cfg)
        torch.testing.assert_close(y.float(), want - bias.float(), atol=2e-2, rtol=1e-2)
    if M <= 32:  # the default tile, K split by the grid's size
        torch.testing.assert_close(skinny_gemm.skinny_gemm(x, w, bias).float(), want,
                                   atol=2e-2, rtol=1e-2)
    else:
        with pytest.raises(ValueError, match="no few-token tile"):
            skinny_gemm.skinny_gemm(x, w, bias)


@pytest.mark.skipif(skinny_gemm.TensorDescriptor is None, reason="Triton without descriptors")
def test_tma_tiles_fall_back_to_pointer_loads_where_tma_cannot_read() -> None:
    """TMA needs 16-byte aligned bases and row strides: an x that starts one element into
    its buffer, or rows of 36 bytes, run the same tile with pointer loads, same numbers."""
    cfg = dict(BLOCK_N=16, BLOCK_K=32, STAGES=2, SPLIT=2, SWAP=1, TMA=1, num_warps=4)
    w = _rand(48, 64, seed=8) * 0.1
    buf = _rand(3 * 64 + 1, seed=9)
    x = buf[1:].view(3, 64)  # 2 bytes past a 16-byte boundary
    assert skinny_gemm._tma_ok(buf[:192].view(3, 64), w) == (
        DEVICE == "cpu" or torch.cuda.get_device_capability()[0] >= 9)
    assert not skinny_gemm._tma_ok(x, w)
    assert not skinny_gemm._tma_ok(_rand(3, 18, seed=10), _rand(48, 18, seed=11))
    want = x.float() @ w.float().t()
    torch.testing.assert_close(skinny_gemm.skinny_gemm(x, w, None, cfg).float(), want,
                               atol=2e-2, rtol=1e-2)


def _runs_on_the_interpreter(x: torch.Tensor, w: torch.Tensor) -> bool:
    """``runs``' rule without its device check (the interpreter runs the kernel here)."""
    return (2 <= x.shape[0] <= skinny_gemm.MAX_M and w.dtype == x.dtype
            and skinny_gemm.config_for(x.shape[0], *w.shape) is not None)


def test_where_the_kernel_runs() -> None:
    """Only CUDA, 2..MAX_M rows of a 16-bit weight in x's dtype with a tile for the shape:
    the measured Llama-2-7B tiles, a default at 16 and 32 rows, cuBLAS beyond."""
    rows = {M: torch.empty(M, 4096, dtype=torch.bfloat16) for M in (1, 2, 64, 100, 129)}
    w = torch.empty(4096, 4096, dtype=torch.bfloat16)
    odd = torch.empty(96, 4096, dtype=torch.bfloat16)
    assert skinny_gemm.config_for(2, 4096, 4096) is not None
    assert not skinny_gemm.runs(rows[2], w)  # the CPU: torch, not the interpreter
    assert [skinny_gemm.config_for(M, 12288, 4096) is not None for M in (1, 2, 64, 100)] == [
        True, True, False, False]  # qkv: tiles at 16/32 rows, cuBLAS at 64 and 128
    assert skinny_gemm.config_for(100, 4096, 4096) is not None  # o: a tile at 128 rows
    assert skinny_gemm.config_for(2, 96, 4096) is not None  # the default tile at 16 rows
    assert skinny_gemm.config_for(64, 96, 4096) is None  # no tile measured at 64: cuBLAS
    assert skinny_gemm.config_for(64, 4096, 11008)["TMA"]
    if torch.cuda.is_available():
        cuda = {M: r.cuda() for M, r in rows.items()}
        assert [skinny_gemm.runs(cuda[M], w.cuda()) for M in (1, 2, 64, 100, 129)] == [
            False, True, True, True, False]
        assert skinny_gemm.runs(cuda[2], odd.cuda())
        assert not skinny_gemm.runs(cuda[2], w.cuda().float())  # fp32 would run in tf32


def test_kernels_launch_without_programmatic_dependency_off_cuda() -> None:
    assert not pdl.enabled(torch.device("cpu"))
    assert pdl.launch(torch.device("cpu")) == {"PDL": False}
    assert pdl.launch(torch.device("cpu"), on=False) == {"PDL": False}
    # the attention kernels follow the step ops: on with the all-Triton step only
    assert fused_ops.TRITON.dependent_launch and not fused_ops.EAGER.dependent_launch


@pytest.mark.parametrize("kind", [ADD_NORM, SILU_MUL])
def test_matmul_takes_the_few_token_kernel_where_the_step_ops_ask(kind, monkeypatch) -> None:
    """With ``few_token_matmul`` a step of a few tokens runs the step ops' prologue kernel,
    then the skinny kernel; without it, cuBLAS (or torch on the CPU). Same numbers."""
    M, N, K = 5, 40, 64
    layer = DenseLinear(N, K, False, torch.device(DEVICE), torch.bfloat16, torch.bfloat16)
    layer.weight.copy_(_rand(N, K, seed=4) * 0.1)
    x = _rand(M, 2 * K if kind == SILU_MUL else K, seed=5)
    prologue = Prologue(kind, _rand(M, K, seed=6) if kind == ADD_NORM else None,
                        _rand(K, seed=7) + 1 if kind == ADD_NORM else None, EPS)
    if DEVICE == "cpu":
        monkeypatch.setattr(skinny_gemm, "runs", _runs_on_the_interpreter)
    calls = []
    real = skinny_gemm.skinny_gemm
    monkeypatch.setattr(skinny_gemm, "skinny_gemm",
                        lambda *a, **k: calls.append(1) or real(*a, **k))
    without = dataclasses.replace(fused_ops.TRITON, few_token_matmul=False)
    want, want_res = matmul(layer, x, prologue, without)
    assert calls == []
    y, carried = matmul(layer, x, prologue, fused_ops.TRITON)
    assert calls == [1]
    torch.testing.assert_close(y.float(), want.float(), atol=2e-2, rtol=1e-2)
    if kind == ADD_NORM:
        assert torch.equal(carried, want_res)
    else:
        assert carried is None and want_res is None


@pytest.mark.parametrize("M, N, K", [(2, 48, 96), (33, 64, 128)])
def test_int8_codes_match_their_dequantised_weight(M, N, K) -> None:
    """int8 codes with a scale per output row: the tile widens the codes (exact) and scales
    the sums, so it equals the matmul with the dequantised weight, in every tile shape."""
    from backend.layers.quantize import quantize_int8

    x = _rand(M, K, seed=12)
    q, scale = quantize_int8(_rand(N, K, dtype=torch.float32, seed=13) * 0.1)
    scale = scale.to(torch.bfloat16)
    want = x.float() @ (q.float() * scale.float()[:, None]).t()
    for cfg in CONFIGS:
        y = skinny_gemm.skinny_gemm(x, q, None, cfg, scale=scale)
        assert y.shape == (M, N) and y.dtype == torch.bfloat16
        torch.testing.assert_close(y.float(), want, atol=2e-2, rtol=1e-2)


def test_int8_matmul_takes_a_measured_tile(monkeypatch) -> None:
    """``quant_kernels.int8_matmul`` runs the few-token kernel for a bucket and shape with an
    int8 tile (the Llama-2-7B shapes at 16, 32 and 64 rows), the int8 GEMM elsewhere."""
    from backend.layers import quant_kernels
    from backend.layers.quantize import quantize_int8

    if not quant_kernels.AVAILABLE:
        pytest.skip("needs the Triton kernels")
    assert skinny_gemm.int8_config_for(64, 12288, 4096)["TMA"]
    assert skinny_gemm.int8_config_for(1, 12288, 4096) is None  # one token: the GEMV
    assert skinny_gemm.int8_config_for(16, 12288, 4096) is not None  # 16, 32, 64 rows
    assert skinny_gemm.int8_config_for(100, 12288, 4096) is None  # not measured: the GEMM
    M, N, K = 20, 48, 96
    monkeypatch.setitem(skinny_gemm.INT8_CONFIGS, (32, N, K), CONFIGS[1])
    calls = []
    real = skinny_gemm.skinny_gemm
    monkeypatch.setattr(skinny_gemm, "skinny_gemm",
                        lambda *a, **kw: calls.append(a[3]) or real(*a, **kw))
    x = _rand(M, K, dtype=torch.float32, seed=14)
    q, scale = quantize_int8(_rand(N, K, dtype=torch.float32, seed=15) * 0.1)
    want = x @ (q.float() * scale[:, None]).t()
    torch.testing.assert_close(quant_kernels.int8_matmul(x, q, scale), want, atol=1e-3,
                               rtol=1e-3)
    assert calls == [CONFIGS[1]]
    quant_kernels.int8_matmul(x[:16], q, scale)  # the 16-row bucket has no tile
    assert calls == [CONFIGS[1]]
