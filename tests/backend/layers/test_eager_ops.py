"""The eager step ops' CPU forms against torch's own: the norm as layer_norm of [x, -x],
RoPE through a swapped copy and the sign folded into the sine table."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from backend.layers import fused_ops


def _rand(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * 3).to(dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("rows", [1, 7, 512])
def test_cpu_norm_is_rms_norm(dtype, rows) -> None:
    x, res = _rand(rows, 576, dtype=dtype, seed=1), _rand(rows, 576, dtype=dtype, seed=2)
    w = nn_weight(_rand(576, dtype=dtype, seed=3))
    got, carried = fused_ops.add_rms_norm_eager(x, res, w, 1e-5)
    want = F.rms_norm(x + res, (576,), w, 1e-5)
    assert torch.equal(carried, x + res)
    assert got.is_contiguous()  # the packed int4 matmul takes dense rows only
    differ = got != want
    assert differ.float().mean() <= 1e-3  # the sums' order: about 1 in 100,000 in practice
    # one step of the dtype; where x + res is exactly 0, the float32 mean of [x, -x]
    # (about 1e-9, not 0) comes through
    step = torch.finfo(dtype).eps * want.float().abs()[differ] * 1.01 + 1e-6
    assert ((got.float() - want.float()).abs()[differ] <= step).all()


def test_cpu_norm_follows_weight_writes() -> None:
    x = _rand(2, 64, dtype=torch.bfloat16, seed=4)
    w = nn_weight(torch.ones(64, dtype=torch.bfloat16))
    fused_ops.add_rms_norm_eager(x, None, w, 1e-6)  # the doubled weight is kept
    with torch.inference_mode():  # as the loader writes it
        w.copy_(_rand(64, dtype=torch.bfloat16, seed=5))
    got, _ = fused_ops.add_rms_norm_eager(x, None, w, 1e-6)
    torch.testing.assert_close(got, F.rms_norm(x, (64,), w, 1e-6), atol=0, rtol=1e-2)
    with torch.inference_mode():  # an inference tensor has no version: nothing kept
        wi = _rand(64, dtype=torch.bfloat16, seed=6)
        got, _ = fused_ops.add_rms_norm_eager(x, None, wi, 1e-6)
        torch.testing.assert_close(got, F.rms_norm(x, (64,), wi, 1e-6), atol=0, rtol=1e-2)


def test_float32_norm_stays_rms_norm() -> None:
    x, w = _rand(3, 100, dtype=torch.float32, seed=7), _rand(100, dtype=torch.float32, seed=8)
    assert torch.equal(fused_ops.add_rms_norm_eager(x, None, w, 1e-6)[0],
                       F.rms_norm(x, (100,), w, 1e-6))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_is_rotate_half(dtype) -> None:
    tokens, heads, hd = 3, 5, 64
    qkv = _rand(tokens, (heads + 1) * hd, dtype=dtype, seed=9)
    angles = _rand(tokens, hd // 2, dtype=torch.float32, seed=10)
    emb = torch.cat((angles, angles), dim=-1)
    cos, sin = emb.cos().to(dtype), emb.sin().to(dtype)
    got = qkv.clone()
    fused_ops.rope_eager_(got[:, : heads * hd].view(tokens, heads, hd), cos, sin)
    qk = qkv[:, : heads * hd].view(tokens, heads, hd)
    rotated = torch.cat((-qk[..., hd // 2:], qk[..., : hd // 2]), dim=-1)  # HF rotate_half
    want = qk * cos.unsqueeze(1) + rotated * sin.unsqueeze(1)
    assert torch.equal(got[:, : heads * hd].view(tokens, heads, hd), want)
    assert torch.equal(got[:, heads * hd:], qkv[:, heads * hd:])
    # the flat eager loop's form: the signed table made once, then each layer's heads
    again = qkv.clone()
    fused_ops.rope_signed_(again[:, : heads * hd].view(tokens, heads, hd), cos,
                           fused_ops.signed_sin(sin))
    assert torch.equal(again, got)


def nn_weight(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t, requires_grad=False)
