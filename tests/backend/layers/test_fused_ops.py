"""The fused Triton step kernels against their eager torch references (under the Triton
interpreter on the CPU): fp32 and bf16, odd sizes, strided (non-contiguous) inputs."""
from __future__ import annotations

import pytest
import torch

from backend.layers import fused_ops

pytestmark = pytest.mark.skipif(not fused_ops.AVAILABLE, reason="triton not installed")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16]
# The interpreter narrows float32 to bfloat16 by truncation, the GPU rounds to nearest even
# (as torch): bit-exact only on CUDA, within one bfloat16 step under the interpreter.
EXACT = DEVICE == "cuda"


def _tol(dtype: torch.dtype) -> dict:
    return dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)


def _rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(DEVICE, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows, hidden", [(1, 64), (3, 100), (5, 257)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_add_rms_norm(dtype, rows, hidden, with_residual) -> None:
    x = _rand(rows, hidden, dtype=dtype, seed=1)
    res = _rand(rows, hidden, dtype=dtype, seed=2) if with_residual else None
    w = _rand(hidden, dtype=dtype, seed=3)
    want_out, want_res = fused_ops.add_rms_norm_eager(x, res, w, 1e-6)
    got_out, got_res = fused_ops.add_rms_norm_triton(x, res, w, 1e-6)
    if EXACT or dtype == torch.float32:
        assert torch.equal(got_res, want_res)  # the carried residual rounds as eager
    torch.testing.assert_close(got_res, want_res, **_tol(dtype))
    torch.testing.assert_close(got_out, want_out, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, q_heads, kv_heads, hd", [(1, 4, 2, 64), (3, 5, 1, 10),
                                                          (2, 8, 8, 128)])
def test_rope_in_place_on_qkv_rows(dtype, tokens, q_heads, kv_heads, hd) -> None:
    heads = q_heads + kv_heads
    qkv = _rand(tokens, (heads + kv_heads) * hd, dtype=dtype, seed=4)  # q | k | v rows
    angles = _rand(tokens, hd // 2, dtype=torch.float32, seed=5) * 3
    emb = torch.cat((angles, angles), dim=-1)  # [T, hd], HF layout
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    want, got = qkv.clone(), qkv.clone()
    fused_ops.rope_eager_(want[:, : heads * hd].view(tokens, heads, hd), cos, sin)
    fused_ops.rope_triton_(got[:, : heads * hd].view(tokens, heads, hd), cos, sin)
    torch.testing.assert_close(got, want, **_tol(dtype))
    assert torch.equal(got[:, heads * hd:], qkv[:, heads * hd:])  # v untouched


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens, inter", [(1, 64), (3, 99), (2, 1500)])
def test_silu_mul(dtype, tokens, inter) -> None:
    gate_up = _rand(tokens, 2 * inter, dtype=dtype, seed=6)
    want = fused_ops.silu_mul_eager(gate_up)
    got = fused_ops.silu_mul_triton(gate_up)
    torch.testing.assert_close(got, want, **_tol(dtype))
