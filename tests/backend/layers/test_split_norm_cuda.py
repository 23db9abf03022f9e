"""The RMSNorm split between two int4 one-token GEMVs on CUDA (``quant_kernels.SPLIT_NORM``):
the producer's sum is the matmul plus the residual to the bit, the consumer matches the norm
kernel then the layer to bf16's precision, and a block at one token carries ``Summed`` from
layer to layer with the same q, k, v as the norm kernels give. CUDA only (the kernels'
arithmetic in the interpreter: ``test_quant_kernels.py``)."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from backend.layers import quant_kernels
from backend.layers.fused_ops import TRITON
from backend.layers.gemv import NORM, SILU_MUL, Prologue
from backend.layers.linear import LinearRows, WeightFormat, make_linear, matmul_into_stream
from backend.model import DecoderLayer, Summed

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")
INT4 = WeightFormat("int4", None, 128)


@pytest.fixture(autouse=True)
def split_norm(monkeypatch):
    monkeypatch.setattr(quant_kernels, "SPLIT_NORM", True)


def _randn(*shape: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen) * scale).to(CUDA, torch.bfloat16)


def _layer(n: int, k: int, seed: int):
    layer = make_linear(INT4, n, k, False, CUDA, torch.bfloat16)
    LinearRows(layer).load(_randn(n, k, seed=seed, scale=0.05).float().cpu())
    return layer


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.parametrize("n,k", [(4096, 4096), (4096, 11008), (768, 512)])
def test_the_added_sum_is_the_matmul_plus_the_residual(n, k):
    layer = _layer(n, k, seed=1)
    x, res = _randn(1, k, seed=2), _randn(1, n, seed=3)
    assert layer.adds_residual(x)
    h, ss = layer.one_token_added(x, res)
    want = (layer(x).float() + res.float()).to(torch.bfloat16)
    assert torch.equal(h, want)
    torch.testing.assert_close(ss.sum(), want.float().pow(2).sum(), rtol=1e-5, atol=0)
    again = layer.one_token_added(x, res)
    assert torch.equal(again[0], h) and torch.equal(again[1], ss)


@pytest.mark.parametrize("n,k", [(12288, 4096), (22016, 4096), (256, 768)])
def test_the_normed_layer_matches_the_norm_kernel_then_the_layer(n, k):
    producer = _layer(k, 512, seed=4)
    h, ss = producer.one_token_added(_randn(1, 512, seed=5), _randn(1, k, seed=6))
    w = _randn(k, seed=7, scale=0.1) + 1
    layer = _layer(n, k, seed=8)
    got = layer.one_token_normed(h, Prologue(NORM, None, w, 1e-5, ss))
    normed, stream = TRITON.add_rms_norm(h, None, w, 1e-5)
    assert stream is h
    assert _rel(got, layer(normed)) < 1e-2


def test_a_block_at_one_token_carries_the_sum_to_the_next(monkeypatch):
    cfg = SimpleNamespace(head_dim=128, num_attention_heads=4, num_key_value_heads=4,
                          hidden_size=512, intermediate_size=1024, attention_bias=False,
                          rms_norm_eps=1e-5)
    layers = []
    for i in range(2):
        layer = DecoderLayer(cfg, CUDA, torch.bfloat16, INT4)
        for j, name in enumerate(("qkv", "o", "gate_up", "down")):
            lin = getattr(layer, name)
            LinearRows(lin).load(_randn(*lin.weight_shape, seed=10 * i + j, scale=0.05)
                                 .float().cpu())
        layer.input_norm.copy_(_randn(512, seed=50 + i, scale=0.1) + 1)
        layer.post_norm.copy_(_randn(512, seed=60 + i, scale=0.1) + 1)
        layers.append(layer)
    out, residual = _randn(1, 512, seed=70), _randn(1, 512, seed=71)
    cos, sin = torch.ones(1, 128, device=CUDA), torch.zeros(1, 128, device=CUDA)
    runs = {}
    for on in (True, False):
        monkeypatch.setattr(quant_kernels, "SPLIT_NORM", on)
        y, carried = layers[0].post_attention(out, residual, TRITON)
        assert isinstance(carried, Summed) == on
        runs[on] = [t.clone() for t in layers[1].pre_attention(y, carried, cos, sin, TRITON,
                                                               rope=False)]
    for got, want in zip(runs[True], runs[False]):
        assert _rel(got, want) < 2e-2


@pytest.mark.parametrize("fmt", [WeightFormat(), WeightFormat("int8")])
def test_layers_without_the_epilogue_keep_their_own_fused_prologue(fmt):
    layer = make_linear(fmt, 512, 1024, False, CUDA, torch.bfloat16)
    LinearRows(layer).load(_randn(512, 1024, seed=9, scale=0.05).float().cpu())
    calls = []
    ops = dataclasses.replace(TRITON, silu_mul=lambda x: calls.append(x) or TRITON.silu_mul(x))
    gate_up, res = _randn(1, 2048, seed=10), _randn(1, 512, seed=11)
    assert not layer.adds_residual(gate_up)
    y, ss = matmul_into_stream(layer, gate_up, Prologue(SILU_MUL), res, ops)
    assert ss is None and y.shape == (1, 512)
    if fmt.kind == "dense":  # the bf16 GEMV computes SiLU·mul itself: no separate kernel
        assert not calls
