"""The CPU's dense prefill copies of quantised layers (``--prefill-dense-weights``): many-row
calls multiply by the kept copy and give the bits of the dequantise-per-call path, few-row
calls keep the packed kernels, the auto / on / off choice respects its budget, a reload
rebuilds the copy, and the engine reports what it chose."""
from __future__ import annotations

import pytest
import torch

from backend.engine.config import (GPU_PREFILL_DENSE_SHARE, PREFILL_DENSE_MAX_GIB, EngineConfig,
                                   prefill_dense_budget)
from backend.engine.llm_engine import LLMEngine
from backend.layers import cpu_dequant
from backend.layers.linear import (DenseLinear, LinearRows, WeightFormat, keep_prefill_dense,
                                   make_linear)
from backend.model import LlamaModel
from backend.weights.loader import synthetic_source

CPU = torch.device("cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _layer(kind: str, n: int, k: int, dtype: torch.dtype, seed: int):
    gen = torch.Generator().manual_seed(seed)
    layer = make_linear(WeightFormat(kind, None, 32), n, k, True, CPU, dtype)
    LinearRows(layer).load(torch.randn(n, k, generator=gen) * 0.05)
    layer.bias.copy_(torch.randn(n, generator=gen))
    return layer


def _x(rows: int, k: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(rows, k, generator=torch.Generator().manual_seed(rows)).to(dtype)


def _key(kind: str, dtype: torch.dtype) -> str:
    """The threshold a kept copy in ``dtype`` is used from: oneDNN's layout or the plain one."""
    return kind if dtype == torch.bfloat16 and cpu_dequant.onednn_bf16() else f"{kind}-plain"


def _copy_kernel(dtype: torch.dtype) -> str:
    onednn = dtype == torch.bfloat16 and cpu_dequant.onednn_bf16()
    return "dense-copy+onednn" if onednn else "dense-copy+F.linear"


def _refuse(*args: object) -> torch.Tensor:
    raise AssertionError("the per-call dequantising pass ran although a dense copy is kept")


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("chunk", [1 << 22, 64 * 64], ids=["one-block", "blocks"])
def test_dense_copy_gives_the_dequantising_paths_bits(kind, dtype, chunk, monkeypatch):
    monkeypatch.setattr(cpu_dequant, "CHUNK_ELEMENTS", chunk)
    # Without a copy the per-call pass starts where a copy would be used, so each row count
    # runs the same arithmetic with and without the copy.
    threshold = cpu_dequant.COPY_MIN_ROWS[_key(kind, dtype)]
    monkeypatch.setitem(cpu_dequant.DENSE_MIN_ROWS, kind, threshold)
    n, k = 320, 128
    layer = _layer(kind, n, k, dtype, seed=3)
    rows = (1, threshold - 1, threshold, 3 * threshold + 5)
    before = {m: layer(_x(m, k, dtype)) for m in rows}  # no copy: scratch pass / packed
    assert layer.prefill_kernel() == "cpu-dequant+F.linear"

    held = layer.keep_prefill_dense(True)
    assert held == n * k * dtype.itemsize == layer.prefill_dense_bytes()
    assert layer.prefill_weight.dtype == dtype
    assert layer.prefill_kernel() == _copy_kernel(dtype)
    assert "prefill_weight" not in layer.state_dict()  # derived, never saved
    monkeypatch.setattr(cpu_dequant, f"{kind}_matmul", _refuse)
    for m in rows:
        # The same values in the same operand layout: the same bits, above the threshold
        # through the copy, below it through the untouched packed kernel.
        assert torch.equal(layer(_x(m, k, dtype)), before[m]), m

    assert layer.keep_prefill_dense(False) == 0 and layer.prefill_weight is None
    with pytest.raises(AssertionError, match="dequantising pass ran"):
        layer(_x(threshold, k, dtype))  # dropped: back on the per-call pass


def _refuse_packed(*args: object) -> torch.Tensor:
    raise AssertionError("the packed kernel ran")


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_kept_copy_takes_batches_the_packed_kernel_would(kind, monkeypatch):
    # Below the per-call pass's threshold and from the copy's: the packed kernel without a
    # copy, the copy with one; fewer rows keep the packed kernel either way.
    copy_rows = cpu_dequant.COPY_MIN_ROWS[_key(kind, torch.bfloat16)]
    dense_rows = cpu_dequant.DENSE_MIN_ROWS[kind]
    assert copy_rows < dense_rows
    layer = _layer(kind, 128, 64, torch.bfloat16, seed=6)
    packed = ("_weight_int8pack_mm" if kind == "int8" else "_weight_int4pack_mm_for_cpu")
    x = _x(copy_rows, 64, torch.bfloat16)
    without = layer(x)
    layer.keep_prefill_dense(True)
    monkeypatch.setattr(torch, packed, _refuse_packed)
    with_copy = layer(x)
    assert (with_copy - without).abs().max() <= 0.05 * without.abs().max()
    with pytest.raises(AssertionError, match="packed kernel ran"):
        layer(_x(copy_rows - 1, 64, torch.bfloat16))


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_reload_rebuilds_the_copy(kind):
    layer = _layer(kind, 128, 64, torch.float32, seed=4)
    layer.keep_prefill_dense(True)
    x = _x(cpu_dequant.DENSE_MIN_ROWS[kind], 64, torch.float32)
    old = layer(x)
    LinearRows(layer).load(torch.randn(128, 64, generator=torch.Generator().manual_seed(5)))
    assert layer.prefill_weight is not None
    new = layer(x)
    layer.keep_prefill_dense(False)
    assert torch.equal(new, layer(x)) and not torch.equal(new, old)


def test_int4_layout_not_read_keeps_the_packed_kernel():
    # rows not in whole blocks of the packing (64 rows with AVX-512, else 32)
    rows = {64: 96, 32: 80}[cpu_dequant.int4_block_n()]
    layer = _layer("int4", rows, 64, torch.float32, seed=0)
    assert not layer.dense_from_packed and layer.prefill_dense_bytes() == 0
    chosen = keep_prefill_dense([layer], "on", 0)
    assert (chosen.enabled, chosen.bytes, chosen.layers) == (False, 0, 0)
    assert layer.prefill_weight is None
    assert layer.prefill_kernel() == "torch._weight_int4pack_mm_for_cpu"


def _model(fmt: str = "int4", head: str = "int4", dtype: torch.dtype = torch.bfloat16
           ) -> LlamaModel:
    cfg = synthetic_source("tiny-qwen2").config  # tied head: quantised as its own copy
    return LlamaModel(cfg, CPU, dtype, max_len=256,
                      weight_format=WeightFormat(fmt, None, 32) if fmt != "dense"
                      else WeightFormat(),
                      lm_head_format=WeightFormat(head, None, 32) if head != "model"
                      else WeightFormat())


def test_auto_on_off_and_the_budget():
    model = _model()
    quantised = [m for m in model.modules() if hasattr(m, "prefill_weight")]
    assert len(quantised) == 2 * 4 + 1  # qkv, o, gate_up, down per block, and the head
    need = sum(m.out_features * m.in_features * 2 for m in quantised)  # bf16

    fits = keep_prefill_dense(model.modules(), "auto", need)
    assert (fits.enabled, fits.layers, fits.bytes, fits.needed_bytes, fits.max_bytes) == (
        True, len(quantised), need, need, need)
    assert "within" in fits.reason
    assert all(m.prefill_weight is not None for m in quantised)

    over = keep_prefill_dense(model.modules(), "auto", need - 1)  # one byte short: none
    assert (over.enabled, over.layers, over.bytes, over.needed_bytes) == (False, 0, 0, need)
    assert "over" in over.reason
    assert all(m.prefill_weight is None for m in quantised)

    forced = keep_prefill_dense(model.modules(), "on", 0)  # on ignores the budget
    assert (forced.enabled, forced.bytes, forced.max_bytes) == (True, need, None)
    off = keep_prefill_dense(model.modules(), "off", 1 << 40)
    assert (off.enabled, off.bytes, off.needed_bytes) == (False, 0, need)
    assert all(m.prefill_weight is None for m in quantised)

    with pytest.raises(ValueError, match="auto, on, off"):
        keep_prefill_dense(model.modules(), "always", 0)


def test_auto_budget_by_device():
    """Unset, auto's budget is 1 GiB on the CPU and a quarter of a GPU's memory (a 7 B
    model's 12 GiB of copies fit an 80 GB card, not a 24 GB one); a setting wins on both."""
    gib = 2**30
    assert prefill_dense_budget(None, "cpu") == int(PREFILL_DENSE_MAX_GIB * gib) == gib
    assert prefill_dense_budget(None, "cpu", 80 * gib) == gib  # a CPU's RAM is not the measure
    assert prefill_dense_budget(None, "cuda", 80 * gib) == int(80 * gib * GPU_PREFILL_DENSE_SHARE)
    copies_7b = int(12.06 * gib)
    assert prefill_dense_budget(None, "cuda", 80 * gib) >= copies_7b
    assert prefill_dense_budget(None, "cuda", 24 * gib) < copies_7b
    assert prefill_dense_budget(0.5, "cuda", 80 * gib) == prefill_dense_budget(0.5, "cpu") \
        == gib // 2
    assert prefill_dense_budget(0.0, "cuda", 80 * gib) == 0


def test_float32_dense_weights_have_nothing_to_keep():
    model = _model("dense", "model", torch.float32)
    assert isinstance(model.lm_head, DenseLinear)
    chosen = keep_prefill_dense(model.modules(), "on", 1 << 30)
    assert (chosen.enabled, chosen.needed_bytes) == (False, 0)
    assert chosen.reason == "no linear layer that a copy would serve"
    assert model.layers[0].qkv.prefill_kernel() == "dense"


@pytest.mark.skipif(not cpu_dequant.onednn_bf16(), reason="oneDNN runs no bf16 matmul here")
def test_bf16_dense_layers_keep_a_reordered_copy_with_the_same_bits(monkeypatch):
    model = _model("dense", "model")
    layers = [m for m in model.modules() if isinstance(m, DenseLinear)]
    x = {m: _x(5, m.in_features, torch.bfloat16) for m in layers}
    plain = {m: m(x[m]) for m in layers}
    chosen = keep_prefill_dense(model.modules(), "auto", 1 << 30)
    need = sum(m.weight.numel() * 2 for m in layers)  # the tied head: the embedding's
    assert (chosen.enabled, chosen.layers, chosen.bytes) == (True, len(layers), need)
    assert all(m.kernel == m.prefill_kernel() == "dense-onednn" for m in layers)
    monkeypatch.setattr(torch.nn.functional, "linear", _refuse_packed)  # every call: the copy
    for m in layers:
        assert torch.equal(m(x[m]), plain[m])
    monkeypatch.undo()
    o = model.layers[0].o
    LinearRows(o).load(torch.randn(o.out_features, o.in_features,
                                   generator=torch.Generator().manual_seed(2)))
    reloaded = o(x[o])
    keep_prefill_dense(model.modules(), "off", 0)
    assert o.kernel == "dense" and torch.equal(o(x[o]), reloaded)  # the copy followed


def test_engine_reports_its_choice_and_scores_the_same():
    """Through the engine: the default (auto, 1 GiB) keeps copies of a small model, off
    does not, a budget too small turns auto off; a 200-token prompt (every linear call
    above both thresholds) gives the same logits either way."""
    source = synthetic_source("tiny")
    tokens = [(7 * i) % 500 + 3 for i in range(200)]
    base = dict(weights_dtype="int4", lm_head_dtype="int8", dtype="bfloat16",
                kv_cache_memory_gib=0.01, max_model_len=256)
    assert EngineConfig().prefill_dense_weights == "auto"
    assert EngineConfig().prefill_dense_max_gib is None  # by device: 1 GiB on the CPU
    stats, scores = {}, {}
    for name, extra in {"auto": {}, "off": {"prefill_dense_weights": "off"},
                        "small": {"prefill_dense_max_gib": 1e-6}}.items():
        engine = LLMEngine(EngineConfig(**base, **extra), source)
        stats[name] = engine.stats()
        scores[name] = engine.score(tokens)
    cfg = source.config
    per_block = (cfg.hidden_size + 2 * cfg.num_key_value_heads * cfg.head_dim) * \
        cfg.hidden_size + cfg.hidden_size ** 2 + 3 * cfg.intermediate_size * cfg.hidden_size
    need = 2 * (cfg.num_hidden_layers * per_block + cfg.vocab_size * cfg.hidden_size)
    auto = stats["auto"].prefill_dense_weights
    assert (auto["mode"], auto["enabled"], auto["bytes"], auto["max_bytes"]) == (
        "auto", True, need, int(PREFILL_DENSE_MAX_GIB * 2**30))
    assert stats["auto"].prefill_kernel == _copy_kernel(torch.bfloat16)
    op = stats["auto"].cpu_aot_kernels["int4_w4a8"]["status"] in ("loaded", "built")
    assert stats["auto"].linear_kernel == (  # decode: the packed kernel or the int4 x int8 op
        "cpu-int4-w4a8x2" if op else "torch._weight_int4pack_mm_for_cpu")
    for name in ("off", "small"):
        chosen = stats[name].prefill_dense_weights
        assert (chosen["enabled"], chosen["bytes"], chosen["needed_bytes"]) == (
            False, 0, need), name
        assert stats[name].prefill_kernel == "cpu-dequant+F.linear"
    assert torch.equal(scores["auto"], scores["off"])


def test_an_int8_head_takes_its_copy_from_its_own_row_count(monkeypatch):
    # The head reads its whole weight from memory every step: its copy wins at fewer rows
    # than a block layer's, and the model gives it that threshold.
    model = _model("int8", "int8")
    keep_prefill_dense(model.modules(), "on", 0)
    head, block = model.lm_head, model.layers[0].o
    key = _key("int8", torch.bfloat16)
    rows = cpu_dequant.HEAD_COPY_MIN_ROWS[key]
    assert rows < cpu_dequant.COPY_MIN_ROWS[key]
    monkeypatch.setattr(torch, "_weight_int8pack_mm", _refuse_packed)
    head(_x(rows, head.in_features, torch.bfloat16))  # through the copy
    with pytest.raises(AssertionError, match="packed kernel ran"):
        block(_x(rows, block.in_features, torch.bfloat16))


@pytest.mark.skipif(not cpu_dequant.onednn_bf16(), reason="oneDNN runs no bf16 matmul here")
@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_bf16_copy_is_reordered_for_onednn_and_survives_dtype_moves(kind):
    layer = _layer(kind, 192, 64, torch.bfloat16, seed=8)
    plain = layer._dense_for_prefill()  # [N, K] for int8, W.T [K, N] for int4
    layer.keep_prefill_dense(True)
    w = layer.prefill_weight
    assert w.is_mkldnn and w.shape == (192, 64)
    assert torch.equal(w.to_dense(), plain if kind == "int8" else plain.t())
    x = _x(cpu_dequant.COPY_MIN_ROWS[kind], 64, torch.bfloat16)
    y = layer(x)
    # .float() cannot convert oneDNN's layout itself: the copy goes through its plain form
    layer.float()
    assert not layer.prefill_weight.is_mkldnn
    assert layer.prefill_weight.shape == plain.shape  # the plain layout the class reads
    assert layer.prefill_kernel() == "dense-copy+F.linear"
    y32 = layer(x.float())
    assert (y32 - y.float()).abs().max() <= 0.02 * y.float().abs().max()
    layer.bfloat16()  # and back: reordered again, the same bits as before
    assert layer.prefill_weight.is_mkldnn
    assert torch.equal(layer(x), y)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_a_plain_copy_keeps_the_plain_threshold(kind, monkeypatch):
    # float32 copies stay in the plain layout (a reorder inside every matmul), so the rows
    # where only a reordered copy beats the packed kernel keep the packed kernel
    rows = cpu_dequant.COPY_MIN_ROWS[kind]
    assert rows < cpu_dequant.COPY_MIN_ROWS[f"{kind}-plain"]
    layer = _layer(kind, 128, 64, torch.float32, seed=9)
    layer.keep_prefill_dense(True)
    assert not layer.prefill_weight.is_mkldnn
    packed = "_weight_int8pack_mm" if kind == "int8" else "_weight_int4pack_mm_for_cpu"
    monkeypatch.setattr(torch, packed, _refuse_packed)
    with pytest.raises(AssertionError, match="packed kernel ran"):
        layer(_x(rows, 64, torch.float32))
    layer(_x(cpu_dequant.COPY_MIN_ROWS[f"{kind}-plain"], 64, torch.float32))  # the copy
