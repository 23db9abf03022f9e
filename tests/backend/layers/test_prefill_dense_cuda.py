"""Dense copies of quantised layers on CUDA (``--prefill-dense-weights``): a layer holding one
runs its many-row calls exactly as a dense layer holding the dequantised weight would (cuBLAS,
or the few-token kernel in a step), fewer rows keep the Triton kernels on the codes, and the
copy is what the dequantise-per-call path multiplies by. CUDA only (the CPU's copies are
tested in ``test_prefill_dense.py``)."""
from __future__ import annotations

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import gpu_dequant, quant_kernels
from backend.layers.fused_ops import EAGER, TRITON
from backend.layers.gemv import Prologue
from backend.layers.linear import (GPU_COPY_MIN_ROWS, TRITON_MAX_M, DenseLinear, LinearRows,
                                   WeightFormat, keep_prefill_dense, make_linear, matmul)
from backend.weights.loader import synthetic_source

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
CUDA = torch.device("cuda")
# (kind, group size): the engine's int4 g128 and the GGUF's g32, and int8
FORMATS = [("int4", 128), ("int4", 32), ("int8", 32)]


def _layer(kind: str, group: int, n: int, k: int, seed: int, bias: bool = False):
    gen = torch.Generator().manual_seed(seed)
    layer = make_linear(WeightFormat(kind, None, group), n, k, bias, CUDA, torch.bfloat16)
    LinearRows(layer).load(torch.randn(n, k, generator=gen) * 0.05)
    if bias:
        layer.bias.copy_(torch.randn(n, generator=gen).to(CUDA))
    return layer


def _x(rows: int, k: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(rows)
    return torch.randn(rows, k, generator=gen).to(CUDA, torch.bfloat16)


def _refuse(*args: object, **kwargs: object) -> torch.Tensor:
    raise AssertionError("a Triton kernel on the codes ran")


@pytest.mark.parametrize("kind,group", FORMATS)
@pytest.mark.parametrize("bias", [False, True])
# o's shape in Llama-2-7B has a few-token tile at 64 rows; the small one runs cuBLAS
@pytest.mark.parametrize("n,k", [(768, 512), (4096, 4096)])
def test_many_rows_run_as_the_dense_layer_of_the_copy(kind, group, bias, n, k, monkeypatch):
    layer = _layer(kind, group, n, k, seed=1, bias=bias)
    assert layer.keep_prefill_dense(True) == n * k * 2
    w = layer.prefill_weight
    assert w.shape == (n, k) and w.dtype == torch.bfloat16
    # the copy is the dequantise-per-call path's weight, to the bit
    want = gpu_dequant.int4_dense(layer.packed, layer.scale_min, group) if kind == "int4" \
        else gpu_dequant.int8_dense(layer.q, layer.scale, torch.bfloat16)
    assert torch.equal(w, want)
    dense = DenseLinear.over(w)
    if bias:
        dense.bias = layer.bias
    first = GPU_COPY_MIN_ROWS[kind]
    monkeypatch.setattr(quant_kernels, "int4_matmul", _refuse)
    monkeypatch.setattr(quant_kernels, "int8_matmul", _refuse)
    for rows in sorted({first, min(first + 7, TRITON_MAX_M), TRITON_MAX_M, TRITON_MAX_M + 1,
                        300}):
        if rows < first:
            continue
        x = _x(rows, k)
        for ops in (EAGER, TRITON):  # forward (cuBLAS) and a step's few-token kernel
            got, _ = matmul(layer, x, Prologue(), ops)
            ref, _ = matmul(dense, x, Prologue(), ops)
            assert torch.equal(got, ref), (rows, ops.name)


@pytest.mark.parametrize("kind,group", FORMATS)
def test_fewer_rows_keep_the_kernels_on_the_codes(kind, group):
    layer = _layer(kind, group, 768, 512, seed=2)
    rows = [1, 2, 16, GPU_COPY_MIN_ROWS[kind] - 1]
    before = {m: layer(_x(m, 512)) for m in rows}
    layer.keep_prefill_dense(True)
    for m in rows:
        assert torch.equal(layer(_x(m, 512)), before[m]), m
        got, _ = matmul(layer, _x(m, 512), Prologue(), TRITON)
        assert torch.equal(got, before[m]) or m == 1, m  # one token: the fused GEMV's order


@pytest.mark.parametrize("kind,group", FORMATS)
def test_beyond_the_triton_range_the_copy_changes_no_bits(kind, group):
    # there both ways multiply the same dequantised weight with cuBLAS
    layer = _layer(kind, group, 768, 512, seed=3)
    x = _x(TRITON_MAX_M + 40, 512)
    without = layer(x)
    layer.keep_prefill_dense(True)
    assert torch.equal(layer(x), without)
    assert layer.prefill_kernel() == "dense-copy+F.linear"
    layer.keep_prefill_dense(False)
    assert layer.prefill_weight is None and layer.prefill_kernel() == "dequant+F.linear"


def test_a_reload_rebuilds_the_copy():
    layer = _layer("int4", 128, 768, 512, seed=4)
    layer.keep_prefill_dense(True)
    x = _x(GPU_COPY_MIN_ROWS["int4"], 512)
    old = layer(x)
    LinearRows(layer).load(torch.randn(768, 512, generator=torch.Generator().manual_seed(9)))
    new = layer(x)
    assert not torch.equal(new, old)
    assert torch.equal(layer.prefill_weight,
                       gpu_dequant.int4_dense(layer.packed, layer.scale_min, 128))


def test_auto_keeps_them_within_the_budget_and_the_engine_reports_it():
    layers = [_layer("int4", 128, 768, 512, seed=s) for s in range(3)]
    need = 3 * 768 * 512 * 2
    chosen = keep_prefill_dense(layers, "auto", need - 1)
    assert not chosen.enabled and all(m.prefill_weight is None for m in layers)
    chosen = keep_prefill_dense(layers, "auto", need)
    assert (chosen.enabled, chosen.layers, chosen.bytes) == (True, 3, need)

    source = synthetic_source("tiny")
    outs, reports = {}, {}
    for mode in ("on", "off"):
        engine = LLMEngine(EngineConfig(device="cuda", dtype="bfloat16", weights_dtype="int4",
                                        int4_group_size=32, prefill_dense_weights=mode,
                                        gpu_copy_min_rows="auto",
                                        max_model_len=512, kv_cache_memory_gib=0.5,
                                        max_num_seqs=64), source)
        reports[mode] = engine.stats().prefill_dense_weights
        rows = engine.stats().gpu_copy_rows
        # timed at start where copies are kept, one crossover per layer shape
        assert rows["mode"] == ("measured" if mode == "on" else "none"), rows
        assert mode == "off" or len(rows["rows"]) >= 3
        params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
        outs[mode] = engine.generate([list(range(3, 203))], params)
    assert reports["on"]["enabled"] and reports["on"]["bytes"] > 0
    assert not reports["off"]["enabled"]
    # a 200-token prefill multiplies the same weight either way; the one-token decode steps
    # keep the codes: the same greedy tokens
    assert outs["on"] == outs["off"]
