"""fp16 weights on the CPU: few rows through fbgemm's packed fp16 kernel, many rows through
the dense float32 matmul on the widened weight; what ``--weights-dtype auto`` picks on a
CPU whose model dtype is float32."""
from __future__ import annotations

import pytest
import torch

from backend.engine import model_runner
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.layers import cpu_fp16
from backend.layers.linear import DenseLinear, WeightFormat, make_linear
from backend.weights.loader import synthetic_source

CPU = torch.device("cpu")
FP16 = WeightFormat("dense", torch.float16)
pytestmark = pytest.mark.skipif(not cpu_fp16.available(), reason="no fbgemm on this CPU")


def test_fp16_layer_matches_its_widened_weight_at_every_row_count():
    gen = torch.Generator().manual_seed(0)
    layer = make_linear(FP16, 48, 64, True, CPU, torch.float32)
    assert (layer.kernel, layer.prefill_kernel()) == ("fbgemm-fp16", "widen+F.linear")
    w = torch.randn(48, 64, generator=gen)
    layer.load_rows(slice(0, 20), w[:20])  # fused layers load from their parts
    layer.load_rows(slice(20, 48), w[20:])
    layer.bias.copy_(torch.randn(48, generator=gen))
    for rows in (1, 8, cpu_fp16.DENSE_MIN_ROWS - 1, cpu_fp16.DENSE_MIN_ROWS, 100):
        x = torch.randn(rows, 64, generator=gen)
        ref = x @ w.half().float().t() + layer.bias
        torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-5)
    # new values after a call: the packed copy follows them
    layer.load_rows(slice(0, 48), -w)
    x = torch.randn(1, 64, generator=gen)
    torch.testing.assert_close(layer(x), x @ -w.half().float().t() + layer.bias,
                               rtol=1e-5, atol=1e-5)


def test_fp16_weights_under_other_activations_stay_dense():
    assert make_linear(FP16, 16, 32, False, CPU, torch.bfloat16).kernel == "dense"
    assert make_linear(WeightFormat(), 16, 32, False, CPU, torch.float32).kernel == "dense"


def test_auto_serves_fp16_weights_where_the_model_runs_in_float32(monkeypatch):
    """No native bf16 and no fast packed int kernels (an AVX2 CPU, pinned here): auto
    stores the layers and the tied head in fp16; an explicit float32 model keeps float32
    weights. Both give the same logits up to fp16 rounding of the weights."""
    monkeypatch.setattr(model_runner, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(model_runner, "cpu_packed_kernels_fast", lambda: False)
    source = synthetic_source("tiny-qwen2")  # q/k/v biases and a tied head
    auto = LLMEngine(EngineConfig(kv_cache_memory_gib=0.01), source)
    exact = LLMEngine(EngineConfig(dtype="float32", kv_cache_memory_gib=0.01), source)
    s = auto.stats()
    assert (s.weights_format, s.linear_kernel, s.lm_head_format) == (
        "fp16", "fbgemm-fp16", "fp16")
    assert exact.stats().weights_format == "fp32"
    assert auto.runner.model.embed.dtype == torch.float32  # the lookup stays float32
    # packed while the engine was built, not at the first request
    fp16_layers = [m for m in auto.runner.model.modules()
                   if isinstance(m, DenseLinear) and m.fp16_packed]
    assert len(fp16_layers) == 4 * source.config.num_hidden_layers + 1
    assert all(m._packed is not None for m in fp16_layers)
    assert auto.runner.model.pack_weights() == 0
    tokens = list(range(300, 340))
    a, e = auto.score(tokens), exact.score(tokens)
    rel = ((a - e).abs().mean() / e.abs().mean()).item()
    assert 0 < rel < 5e-3  # fp16 rounding of N(0, 0.02) weights; a wiring bug gives ~1
    # an int head asked for explicitly is kept
    int8_head = LLMEngine(EngineConfig(lm_head_dtype="int8", kv_cache_memory_gib=0.01),
                          source)
    assert int8_head.stats().lm_head_format == "int8"
