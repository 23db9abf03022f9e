"""The model as an nn.Module, and the three ways of running the work between attention
calls (eager, fused Triton kernels, torch.compile) giving the same greedy tokens as
transformers through the engine (chunked prefill, mixed steps, a single-token decode)."""
from __future__ import annotations

import shutil

import pytest
import torch
from torch._dynamo.utils import counters

from backend.engine.sampling import SamplingParams
from backend.engine.step_ops import resolve_step_ops
from backend.layers import fused_ops
from backend.layers.linear import DenseLinear, Int4Linear, Int8Linear, WeightFormat
from backend.model import LlamaModel
from backend.weights.config import ModelConfig
from tests.backend.tiny_models import hf_greedy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 6, 7, 8, 9, 10, 11], [3, 4, 5], list(range(3, 40))]


@pytest.fixture(scope="module")
def references(tiny_llama) -> list[list[int]]:
    return [hf_greedy(tiny_llama, p, GREEDY.max_tokens) for p in PROMPTS]


def _generate(make_engine, attention: str = "sdpa", **fields) -> tuple[list[list[int]], list[int]]:
    """(greedy tokens of PROMPTS in one batch under a 16-token budget, of one prompt alone)"""
    engine = make_engine(device=DEVICE, attention=attention, max_num_batched_tokens=16, **fields)
    return engine.generate(PROMPTS, GREEDY), engine.generate([[9, 8, 7]], GREEDY)[0]


def test_model_is_a_module_with_every_weight(tiny_llama) -> None:
    cfg = ModelConfig.from_hf_dict(tiny_llama.config.to_dict())
    model = LlamaModel(cfg, "cpu", torch.float32, max_len=64)
    hf_names = set(tiny_llama.state_dict())
    state = model.state_dict()
    assert "cos_table" not in state  # derived from the config: not a weight
    # every HF weight has a home: q|k|v and gate|up fused, nothing else left over
    assert sum(p.numel() for p in model.parameters()) == \
        sum(t.numel() for t in tiny_llama.state_dict().values())
    assert len(state) == len(hf_names) - 3 * cfg.num_hidden_layers  # 5 -> 2 per layer
    other = LlamaModel(cfg, "cpu", torch.float32, max_len=64, seed=1)
    assert not torch.equal(other.layers[1].qkv.weight, model.layers[1].qkv.weight)
    other.load_state_dict(state)
    for (name, a), (_, b) in zip(model.named_parameters(), other.named_parameters()):
        assert torch.equal(a, b), name
    half = model.to(torch.bfloat16)
    assert {p.dtype for p in half.parameters()} == {torch.bfloat16}
    assert half.cos_table.dtype == torch.bfloat16


def test_quantised_codes_are_buffers(tiny_llama) -> None:
    cfg = ModelConfig.from_hf_dict(tiny_llama.config.to_dict())
    model = LlamaModel(cfg, "cpu", torch.float32, max_len=64, weight_format=WeightFormat("int8"))
    names = set(model.state_dict())
    assert {"layers.0.qkv.q", "layers.0.qkv.scale", "layers.1.down.q"} <= names


def test_resolve_step_ops() -> None:
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert resolve_step_ops(None, None, cpu) == "eager"
    assert resolve_step_ops(True, None, cpu) == "compile"
    assert resolve_step_ops(False, False, cuda) == "eager"
    if fused_ops.AVAILABLE:
        assert resolve_step_ops(None, None, cuda) == "triton"


@pytest.mark.skipif(not fused_ops.AVAILABLE, reason="triton not installed")
@pytest.mark.parametrize("attention", ["sdpa", "triton"])  # triton: RoPE inside the KV store
def test_fused_kernels_greedy_parity(make_engine, references, attention) -> None:
    eager, eager_alone = _generate(make_engine, attention, fused_ops=False)
    fused, fused_alone = _generate(make_engine, attention, fused_ops=True)
    assert eager == references
    assert fused == eager and fused_alone == eager_alone


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("c++")),
                    reason="torch.compile on the CPU needs a C++ compiler")
def test_compiled_greedy_parity_without_recompiles(make_engine, references, monkeypatch,
                                                   tmp_path) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    counters.clear()
    engine = make_engine(device=DEVICE, attention="sdpa", max_num_batched_tokens=16,
                         compile=True)
    info = engine.stats().compile
    assert info["enabled"] and info["step_ops"] == "compile" and info["pieces"]
    frames = counters["frames"]["total"]
    assert frames > 0  # the warm-up compiled: a single token and the dynamic token count
    assert engine.generate(PROMPTS, GREEDY) == references
    engine.generate([[9, 8, 7]], GREEDY)
    # prefills of 16 and 13 tokens, decodes of 3, 2, 1: all served by the warm-up's graphs
    assert counters["frames"]["total"] == frames


@pytest.mark.skipif(DEVICE != "cpu" or not (shutil.which("g++") or shutil.which("c++")),
                    reason="dense copies are the CPU's; torch.compile there needs a C++ compiler")
def test_compiled_pieces_run_beside_the_cpus_onednn_copies(make_engine, monkeypatch,
                                                           tmp_path) -> None:
    """bf16 int4 layers keep oneDNN-reordered dense copies for calls of many rows; the
    compiled pieces cannot trace that layout and take the codes instead, so prefills of
    any length are served (they failed as whole requests before)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    engine = make_engine(attention="sdpa", max_num_batched_tokens=64, compile=True,
                         dtype="bfloat16", weights_dtype="int4", int4_group_size=32,
                         weights_scaling="none", prefill_dense_weights="on")
    assert engine.runner.prefill_dense.layers > 0
    outputs = engine.generate(PROMPTS, GREEDY)  # prefills of 7, 3 and 37 tokens
    assert [len(tokens) for tokens in outputs] == [GREEDY.max_tokens] * len(PROMPTS)


@pytest.mark.parametrize("fields", [
    {"dtype": "bfloat16"},
    {"dtype": "bfloat16", "weights_dtype": "int4", "int4_group_size": 32,
     "weights_scaling": "none"},
    {"dtype": "float32", "weights_dtype": "int8", "weights_scaling": "none",
     "kv_cache_dtype": "int8"},
])
def test_flat_eager_loop_matches_each_layers_forward(make_engine, monkeypatch, fields) -> None:
    """The eager step ops' flat loop over the blocks gives every step's logits bit for bit
    as each block's own forward does: prefill chunks, mixed steps and decodes. On the CPU
    its steps of few rows call the quantised layers' bound kernels (``few_rows_fn``)
    instead of their ``forward``."""
    logits: dict[bool, list[torch.Tensor]] = {}
    flat_calls: list[int] = []
    eager_layers = LlamaModel._eager_layers
    monkeypatch.setattr(LlamaModel, "_eager_layers",
                        lambda self, *a: (flat_calls.append(1), eager_layers(self, *a))[1])
    forwards: dict[bool, int] = {}
    for cls in (DenseLinear, Int4Linear, Int8Linear):
        def counting(self, x, forward=cls.forward):
            forwards[flat] += 1
            return forward(self, x)
        monkeypatch.setattr(cls, "forward", counting)
    for flat in (True, False):
        monkeypatch.setattr(LlamaModel, "flat_eager", flat)
        flat_calls.clear()
        forwards[flat] = 0
        engine = make_engine(device=DEVICE, attention="sdpa", max_num_batched_tokens=16,
                             fused_ops=False, **fields)
        seen = logits.setdefault(flat, [])

        def recording(lg, seqs, seen=seen, sample=engine.runner.sampler.sample):
            seen.append(lg.clone())
            return sample(lg, seqs)

        monkeypatch.setattr(engine.runner.sampler, "sample", recording)
        engine.generate(PROMPTS, GREEDY)
        assert bool(flat_calls) == flat  # the path under test ran, and only when asked
    assert len(logits[True]) == len(logits[False]) > len(PROMPTS)
    for a, b in zip(logits[True], logits[False]):
        assert torch.equal(a, b)
    if DEVICE == "cpu" and "weights_dtype" in fields:  # decodes of 1-3 rows: bound kernels
        assert forwards[True] < forwards[False]
    else:
        assert forwards[True] == forwards[False]
