"""Weight-only int8 / int4 linear layers: each packed matmul against the dequantised
reference, the quantisers' error bounds, GGUF codes kept as they are, and the model/engine
wiring (formats, kernels, tied LM head)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from backend.engine import aot_kernels, model_runner
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.layers import cpu_dequant, cpu_fp16, cpu_w4a8
from backend.layers.linear import (Linear, LinearRows, WeightFormat, make_linear,
                                   resolve_weight_format)
from backend.layers.quantize import GroupQuantized, quantize_int4, quantize_int8
from backend.model import LlamaModel
from backend.weights.gguf_loader import load_gguf
from backend.weights.gguf_quant import gguf_codes
from backend.weights.loader import synthetic_source
from tests.backend.weights import gguf_fixtures
from tests.backend.weights.gguf_fixtures import (K_SHAPE, random_hf_tensors, random_kquant,
                                                 write_llama_gguf)

CPU = torch.device("cpu")


def quantised_layer(kind: str, w: torch.Tensor, dtype: torch.dtype, group: int = 32, bias=None):
    """A CPU layer of format ``kind`` loaded from w in two row blocks (as q|k|v and gate|up
    load); shared with the fp8 tests."""
    layer = make_linear(WeightFormat(kind, None, group), w.shape[0], w.shape[1],
                        bias is not None, CPU, dtype)
    half = w.shape[0] // 2  # two row blocks, as fused q|k|v and gate|up load
    LinearRows(layer, slice(0, half)).load(w[:half])
    LinearRows(layer, slice(half, None)).load(w[half:])
    if bias is not None:
        layer.bias.copy_(bias)
    return layer


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("rows", [1, 5, 64])
def test_cpu_packed_matmul_matches_dequantised_reference(kind, dtype, rows):
    gen = torch.Generator().manual_seed(rows)
    w = torch.randn(96, 128, generator=gen) * 0.05
    b = torch.randn(96, generator=gen)
    layer = quantised_layer(kind, w, dtype, bias=b)
    assert layer.kernel == {"int8": "torch._weight_int8pack_mm",
                            "int4": "torch._weight_int4pack_mm_for_cpu"}[kind]
    x = torch.randn(rows, 128, generator=gen).to(dtype)
    ref = x.float() @ layer.dequantized().t() + b.to(dtype).float()
    got = layer(x).float()
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, ref, atol=tol * ref.abs().max().item(), rtol=0)


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("bias", [False, True])
def test_few_rows_fn_is_forward_bit_for_bit_and_follows_reloads(kind, bias):
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(96, 128, generator=gen) * 0.05
    layer = quantised_layer(kind, w, torch.bfloat16,
                            bias=torch.randn(96, generator=gen) if bias else None)
    fn, got_kind = layer.few_rows_fn()
    assert got_kind == kind and fn != layer.forward
    for rows in range(1, cpu_dequant.few_rows_limit(kind)):
        x = torch.randn(rows, 128, generator=gen).to(torch.bfloat16)
        assert torch.equal(fn(x), layer(x))
    # new codes (a reload) or a conversion build new packed tensors: the generation moves
    at = Linear.generation
    LinearRows(layer, slice(0, None)).load(w * 2)
    assert Linear.generation > at
    at = Linear.generation
    layer.float()
    assert Linear.generation > at
    # before loading, or off the CPU, the layer hands out forward itself
    fresh = make_linear(WeightFormat(kind, None, 32), 96, 128, False, CPU, torch.bfloat16)
    assert fresh.few_rows_fn() == (fresh.forward, None)


def test_quantisers_error_bounds_and_reference():
    w = torch.randn(64, 256, generator=torch.Generator().manual_seed(0))
    q, s = quantize_int8(w)
    assert q.dtype == torch.int8 and s.shape == (64,)
    assert ((q.float() * s[:, None] - w).abs() <= s[:, None] / 2 + 1e-6).all()
    g = quantize_int4(w, 32)
    assert g.codes.max() <= 15 and g.scale.shape == (64, 8)
    err = (g.dequantize() - w).abs().view(64, 8, 32)
    assert (err <= g.scale.unsqueeze(-1) / 2 + 1e-5).all()
    with pytest.raises(ValueError, match="group size 128 does not divide"):
        quantize_int4(torch.zeros(4, 576), 128)


def test_int4_layer_keeps_matching_codes_exactly():
    """Q4_1-style codes with the layer's group size go in as they are (no re-quantising)."""
    gen = torch.Generator().manual_seed(3)
    codes = torch.randint(0, 16, (32, 128), generator=gen, dtype=torch.uint8)
    scale = torch.rand(32, 4, generator=gen) * 0.1
    lo = -torch.rand(32, 4, generator=gen)
    payload = GroupQuantized(codes, scale, lo, 32, 4)
    layer = make_linear(WeightFormat("int4", None, 32), 32, 128, False, CPU, torch.float32)
    LinearRows(layer).load(payload)
    torch.testing.assert_close(layer.dequantized(), payload.dequantize(), atol=1e-6, rtol=0)
    # Another group size re-quantises from the values (close, not exact).
    layer64 = make_linear(WeightFormat("int4", None, 64), 32, 128, False, CPU, torch.float32)
    LinearRows(layer64).load(payload)
    err = (layer64.dequantized() - payload.dequantize()).abs().max()
    assert 0 < err < 0.2


@pytest.mark.parametrize("qtype", [Q.Q8_0, Q.Q4_0, Q.Q4_1], ids=lambda q: q.name)
def test_gguf_codes_match_the_gguf_dequantiser(qtype):
    w = np.random.default_rng(0).normal(0, 0.5, (8, 96)).astype(np.float32)
    raw = quantize(w, qtype)
    codes = gguf_codes(raw, qtype)
    assert codes.group_size == 32 and codes.bits == (8 if qtype == Q.Q8_0 else 4)
    np.testing.assert_array_equal(codes.dequantize().numpy(), dequantize(raw, qtype))


def test_q4_k_codes_match_the_gguf_dequantiser():
    """Q4_K (the bulk of Q4_K_M files): 256-weight blocks of eight sub-blocks, each with its
    own 6-bit scale and min times the block's two fp16 factors, are our int4 groups of 32
    with float32 scale / min pairs; the gguf package cannot quantise to it, so random blocks
    with sane factors, every code and 6-bit pair pattern in play."""
    raw = random_kquant((48, 512), Q.Q4_K, seed=3)
    codes = gguf_codes(raw, Q.Q4_K)
    assert (codes.group_size, codes.bits, tuple(codes.codes.shape)) == (32, 4, (48, 512))
    assert tuple(codes.scale.shape) == (48, 16) and int(codes.codes.max()) == 15
    assert len(torch.unique(codes.scale)) == 64  # d = 0.01 times each 6-bit scale, 0..63
    np.testing.assert_array_equal(codes.dequantize().numpy(), dequantize(raw, Q.Q4_K))


def test_resolve_weight_format():
    assert resolve_weight_format("auto", 64, "int4") == WeightFormat("int4", None, 32)
    assert resolve_weight_format("auto", 32, "int8") == WeightFormat("int8")
    assert resolve_weight_format("auto", 32, None) == WeightFormat()
    assert resolve_weight_format("int4", 64, None) == WeightFormat("int4", None, 64)
    assert resolve_weight_format("fp16", 32, "int4") == WeightFormat("dense", torch.float16)
    # where the packed kernels are slow (a CPU without AVX-512), auto is the model dtype;
    # an explicit format stays as asked
    assert resolve_weight_format("auto", 32, "int4", keep_codes=False) == WeightFormat()
    assert resolve_weight_format("auto", 32, "int8", keep_codes=False) == WeightFormat()
    assert resolve_weight_format("int4", 32, "int4", keep_codes=False) == WeightFormat(
        "int4", None, 32)
    with pytest.raises(ValueError, match="weights_dtype must be one of"):
        EngineConfig(weights_dtype="int3")
    with pytest.raises(ValueError, match="int4_group_size must be one of"):
        EngineConfig(int4_group_size=48)


def test_auto_keeps_file_codes_only_where_the_packed_cpu_kernels_are_fast(
        smollm2_source, monkeypatch):
    """The engine asks the CPU: with AVX-512 the embedded model's Q4_1 codes are served as
    int4, beside its Q8_0 head as int8; without AVX-512 too where the int4 x int8 op will
    serve them (its AVX2 build), but the head dense (torch's int8 kernel is unvectorised
    there, and the int8 rows kernel is off here); else every layer dense, in the model
    dtype."""
    cfg = EngineConfig(dtype="float32", kv_cache_memory_gib=0.01, max_model_len=64,
                       cpu_aot_kernels="off")
    asked = []
    for fast, op, want in ((True, False, ("int4-g32", "int8")), (False, True, ("int4-g32", "fp32")),
                           (False, False, ("fp32", "fp32"))):
        monkeypatch.setattr(model_runner, "cpu_packed_kernels_fast", lambda fast=fast: fast)
        monkeypatch.setattr(aot_kernels, "int4_op_ready",
                            lambda mode, act, op=op: asked.append((mode, act)) or op)
        s = LLMEngine(cfg, smollm2_source).stats()
        assert (s.weights_format, s.lm_head_format) == want
    assert asked == [("off", "int8x2")] * 2  # the config's own settings, only where needed


def test_without_avx512_auto_keeps_int4_codes_beside_an_fp16_head(smollm2_source, monkeypatch):
    """An AVX2 CPU (pinned): float32 model, fbgemm for float weights, the int4 x int8 op for
    the file's int4 codes; the file's Q8_0 head goes to fp16 through fbgemm."""
    monkeypatch.setattr(model_runner, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(model_runner, "cpu_packed_kernels_fast", lambda: False)
    monkeypatch.setattr(aot_kernels, "int4_op_ready", lambda mode, act: True)
    s = LLMEngine(EngineConfig(kv_cache_memory_gib=0.01, max_model_len=64,
                               cpu_aot_kernels="off"), smollm2_source).stats()
    assert (s.dtype, s.weights_format, s.lm_head_format) == ("float32", "int4-g32", "fp16")
    assert s.lm_head_kernel == ("fbgemm-fp16" if cpu_fp16.available() else "dense")


def test_without_avx512_auto_keeps_the_q8_head_where_the_int8_rows_kernel_serves(
        smollm2_source, monkeypatch):
    """An AVX2 CPU (pinned) where the int8 rows kernel is built or to be built: the file's
    Q8_0 head stays int8 codes (``cpu_int8_rows`` runs it), asked with the config's mode and
    the model dtype."""
    monkeypatch.setattr(model_runner, "cpu_has_native_bf16", lambda: False)
    monkeypatch.setattr(model_runner, "cpu_packed_kernels_fast", lambda: False)
    monkeypatch.setattr(aot_kernels, "int4_op_ready", lambda mode, act: True)
    asked = []
    monkeypatch.setattr(aot_kernels, "int8_rows_ready",
                        lambda mode, dtype: asked.append((mode, dtype)) or True)
    s = LLMEngine(EngineConfig(kv_cache_memory_gib=0.01, max_model_len=64,
                               cpu_aot_kernels="off"), smollm2_source).stats()
    assert (s.dtype, s.weights_format, s.lm_head_format) == ("float32", "int4-g32", "int8")
    assert asked == [("off", torch.float32)]


def test_the_int4_op_is_ready_where_asked_for_built_or_to_be_built(tmp_path, monkeypatch):
    monkeypatch.setattr(aot_kernels, "kernels_dir", lambda: tmp_path)
    monkeypatch.setattr(cpu_w4a8, "why_not_here", lambda: None)
    assert aot_kernels.int4_op_ready("build", "int8x2")  # compiled at start
    assert not aot_kernels.int4_op_ready("auto", "int8x2")  # none built: torch's kernel
    (tmp_path / cpu_w4a8.library_name()).write_bytes(b"")
    assert aot_kernels.int4_op_ready("auto", "int8")
    assert not aot_kernels.int4_op_ready("off", "int8x2")
    assert not aot_kernels.int4_op_ready("auto", "model")
    monkeypatch.setattr(cpu_w4a8, "why_not_here", lambda: "the CPU lacks avx2")
    assert not aot_kernels.int4_op_ready("build", "int8x2")


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_model_logits_match_a_dense_model_of_the_dequantised_weights(kind):
    """The whole model: quantised layers give the logits of a dense model holding exactly
    the dequantised weights (so every layer is wired to its own rows); tied LM head copy."""
    cfg = synthetic_source("tiny-qwen2").config  # q/k/v biases and a tied head
    fmt = WeightFormat(kind, None, 32)
    quant = LlamaModel(cfg, CPU, torch.float32, max_len=1024, weight_format=fmt,
                       lm_head_format=fmt)
    assert quant.lm_head.kernel != "dense" and quant.layers[0].down.kernel != "dense"
    # the engine first: where it attaches the int4 x int8 op, the layers' many-row calls
    # read the op's codes and fp16 scales from then on, and so does ``dequantized``
    engine_q = LLMEngine(EngineConfig(kv_cache_memory_gib=0.01, dtype="float32"),
                         synthetic_source("tiny-qwen2"), model=quant)
    dense = LlamaModel(cfg, CPU, torch.float32, max_len=1024, random_init=False)
    names = dict(quant._destinations())
    dense.load_weights(
        (name, t.linear.dequantized()[t.rows] if isinstance(t, LinearRows) else t)
        for name, t in names.items())
    dense.lm_head = make_linear(WeightFormat(), cfg.vocab_size, cfg.hidden_size, False, CPU,
                                torch.float32)
    dense.lm_head.load_rows(slice(None), quant.lm_head.dequantized())
    engine_d = LLMEngine(EngineConfig(kv_cache_memory_gib=0.01, dtype="float32"),
                         synthetic_source("tiny-qwen2"), model=dense)
    tokens = list(range(300, 340))
    torch.testing.assert_close(engine_q.score(tokens), engine_d.score(tokens), atol=1e-4,
                               rtol=1e-4)


@pytest.mark.parametrize("qtype,native", [(Q.Q4_0, "int4"), (Q.Q8_0, "int8")],
                         ids=lambda v: getattr(v, "name", v))
def test_gguf_auto_keeps_the_files_code_form(tmp_path, monkeypatch, qtype, native):
    """Q4_0 -> int4 group 32 from the codes (exact up to float rounding); Q8_0 -> int8 (one
    scale per row instead of per 32: re-quantised, close). On a CPU whose packed kernels are
    fast (``cpu_packed_kernels_fast``, pinned here so the test means the same everywhere)."""
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_runner, "cpu_packed_kernels_fast", lambda: True)
    path = write_llama_gguf(tmp_path / f"tiny-{qtype.name}.gguf", random_hf_tensors(seed=4),
                            qtype)
    source = load_gguf(path)
    assert source.weight_quantization == native
    tokens = list(range(5, 30))
    dense = LLMEngine(EngineConfig(weights_dtype="fp32", dtype="float32",
                                   kv_cache_memory_gib=0.01), source)
    auto = LLMEngine(EngineConfig(dtype="float32", kv_cache_memory_gib=0.01), source)
    assert auto.stats().weights_format == {"int4": "int4-g32", "int8": "int8"}[native]
    # the head too where the file keeps it in Q8_0; a Q4 head stays in the model dtype
    assert source.head_quantization == native
    assert auto.stats().lm_head_format == {"int4": "fp32", "int8": "int8"}[native]
    a, d = auto.score(tokens), dense.score(tokens)
    if native == "int4":
        torch.testing.assert_close(a, d, atol=2e-4, rtol=1e-4)
    else:
        # random N(0, 0.5) weights amplify rounding; a wiring bug gives ~1
        assert 0 < ((a - d).abs().mean() / d.abs().mean()).item() < 0.1


def centered_q4_k(shape: tuple[int, int], qtype: Q, seed: int = 0) -> np.ndarray:
    """Q4_K blocks of a model that computes something: random codes, d = dmin = 0.002, each
    sub-block's 6-bit scale sc in 1..7 and min m = 8 sc, so w = 0.002 sc (q - 8) is centred
    and small (random blocks put a large constant in every row and the logits stop depending
    on the tokens)."""
    assert qtype == Q.Q4_K
    rows, cols = shape
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, cols // 256, 144), np.uint8)
    raw[..., 0:4] = np.frombuffer(np.array([0.002, 0.002], np.float16).tobytes(), np.uint8)
    sc = rng.integers(1, 8, (rows, cols // 256, 8)).astype(np.uint8)
    m = 8 * sc  # up to 56: its top two bits go where the format keeps them
    scales = np.zeros((rows, cols // 256, 12), np.uint8)
    scales[..., 0:4] = sc[..., :4]
    scales[..., 4:8] = (m[..., :4] & 63) | ((m[..., 4:] >> 4) << 6)
    scales[..., 8:12] = (sc[..., 4:] & 15) | ((m[..., 4:] & 15) << 4)
    raw[..., 4:16] = scales
    return raw.reshape(rows, -1)


def test_gguf_q4_k_served_as_int4_from_its_codes(tmp_path, monkeypatch):
    """auto on a Q4_K file: int4 group 32 from the file's codes (its scales d * sc in the
    layers' own rounding), the logits of the dequantised file within that rounding; a wiring
    bug (a sub-block's scale on another's codes) gives differences of order one."""
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_runner, "cpu_packed_kernels_fast", lambda: True)
    monkeypatch.setattr(gguf_fixtures, "random_kquant", centered_q4_k)
    path = write_llama_gguf(tmp_path / "tiny-q4_k.gguf", random_hf_tensors(seed=5, shape=K_SHAPE),
                            Q.Q4_K, shape=K_SHAPE)
    source = load_gguf(path)
    assert source.weight_quantization == "int4"
    tokens = list(range(5, 45))
    dense = LLMEngine(EngineConfig(weights_dtype="fp32", dtype="float32",
                                   kv_cache_memory_gib=0.01), source)
    auto = LLMEngine(EngineConfig(dtype="float32", kv_cache_memory_gib=0.01), source)
    assert auto.stats().weights_format == "int4-g32"
    a, d = auto.score(tokens), dense.score(tokens)
    assert (d[1:] - d[:-1]).abs().mean() > 0.1 * d.abs().mean()  # the tokens matter
    rel = ((a - d).abs().mean() / d.abs().mean()).item()
    assert 0 <= rel < 1e-2, rel  # 0: fp32 copies of exact fp32 scales give the same sums


def test_gguf_q4_1_served_from_its_codes(tmp_path, monkeypatch):
    """auto on a Q4_1 file: int4 group 32 from the file's codes, the same logits as the
    dequantised (float32 cache) path up to float rounding; int8 re-quantises them (a CPU
    with fast packed kernels, pinned)."""
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_runner, "cpu_packed_kernels_fast", lambda: True)
    hf = random_hf_tensors(seed=2)
    path = write_llama_gguf(tmp_path / "tiny-q4_1.gguf", hf, Q.Q4_1)
    source = load_gguf(path)
    assert source.weight_quantization == "int4"
    tokens = list(range(5, 40))
    scores, kernels = {}, {}
    for wd in ("fp32", "auto", "int8"):
        engine = LLMEngine(EngineConfig(weights_dtype=wd, dtype="float32",
                                        kv_cache_memory_gib=0.01), source)
        stats = engine.stats()
        kernels[wd] = (stats.weights_format, stats.linear_kernel, stats.lm_head_format)
        scores[wd] = engine.score(tokens)
    assert kernels == {"fp32": ("fp32", "dense", "fp32"),
                       "auto": ("int4-g32", "torch._weight_int4pack_mm_for_cpu", "fp32"),
                       "int8": ("int8", "torch._weight_int8pack_mm", "fp32")}
    torch.testing.assert_close(scores["auto"], scores["fp32"], atol=2e-4, rtol=1e-4)
    rel = (scores["int8"] - scores["fp32"]).abs().mean() / scores["fp32"].abs().mean()
    assert 0 < rel < 0.1  # random N(0, 0.5) weights amplify rounding; a wiring bug gives ~1


def test_gguf_q8_0_head_beside_q4_1_layers_stays_int8(tmp_path, monkeypatch):
    """The embedded file's layout (Q4_1 layers, the tied embedding in Q8_0): auto serves the
    layers from their codes and the head as int8, as llama.cpp reads it; the head follows
    ``--lm-head-dtype`` where one is given, and dense layers keep a dense head."""
    monkeypatch.setenv("FIRSTTOKEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(model_runner, "cpu_packed_kernels_fast", lambda: True)
    path = write_llama_gguf(tmp_path / "tiny-q4_1-q8_0.gguf", random_hf_tensors(seed=3), Q.Q4_1,
                            head_qtype=Q.Q8_0)
    source = load_gguf(path)
    assert (source.weight_quantization, source.head_quantization) == ("int4", "int8")
    tokens = list(range(5, 40))
    formats, scores = {}, {}
    for wd, head in (("auto", "auto"), ("auto", "model"), ("fp32", "auto")):
        engine = LLMEngine(EngineConfig(weights_dtype=wd, lm_head_dtype=head, dtype="float32",
                                        kv_cache_memory_gib=0.01), source)
        stats = engine.stats()
        formats[wd, head] = (stats.weights_format, stats.lm_head_format)
        scores[wd, head] = engine.score(tokens)
    assert formats == {("auto", "auto"): ("int4-g32", "int8"),
                       ("auto", "model"): ("int4-g32", "fp32"),
                       ("fp32", "auto"): ("fp32", "fp32")}
    # the int8 head re-rounds the file's Q8_0 rows per row: close, not equal
    ref = scores["auto", "model"]
    rel = (scores["auto", "auto"] - ref).abs().mean() / ref.abs().mean()
    assert 0 < rel < 0.05
