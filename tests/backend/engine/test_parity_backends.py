"""The engine's parity checks for every attention backend this machine has: greedy tokens
identical to transformers' contiguous-cache decoding with scrambled blocks, chunked prefill
mixing decodes and prefill chunks in one step, batch invariance, prefix-cache hits and
preemption. On the CPU the triton backend runs under the interpreter (slow: the shapes are
small); on a GPU (``python -m backend.engine.gpu_check``) everything runs on CUDA, CUDA
graphs included."""
from __future__ import annotations

import random

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers.attention import triton_attention
from tests.backend.tiny_models import hf_greedy, run_alone

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BACKENDS = ["sdpa", "math"] + (["triton"] if triton_attention is not None else [])
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def _engine(source, attention: str, **kw) -> LLMEngine:
    fields = dict(device=DEVICE, kv_cache_memory_gib=0.005, max_model_len=256,
                  dtype="float32", attention=attention)
    fields.update(kw)
    return LLMEngine(EngineConfig(**fields), source)


def _prompts(lengths: list[int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(n)] for n in lengths]


@pytest.fixture(scope="module")
def references() -> dict:
    """Greedy continuations from transformers, computed once per prompt."""
    return {}


def _reference(tiny_llama, references: dict, prompt: list[int], n: int) -> list[int]:
    key = (tuple(prompt), n)
    if key not in references:
        references[key] = hf_greedy(tiny_llama, prompt, n)
    return references[key]


@pytest.mark.parametrize("attention", BACKENDS)
def test_mixed_steps_on_scrambled_blocks_match_transformers(attention: str, tiny_llama,
                                                            tiny_source, references) -> None:
    """Four prompts (one block exactly, one past it, short, long) under a 24-token budget:
    steps mix decodes with prefill chunks, blocks are handed out in scrambled order."""
    engine = _engine(tiny_source, attention, max_num_batched_tokens=24,
                     enable_prefix_caching=False)
    free = list(engine.block_manager.free)
    random.Random(7).shuffle(free)
    engine.block_manager.free.clear()
    engine.block_manager.free.extend(free)
    steps = []
    engine.step_observer = steps.append
    prompts = _prompts([16, 17, 3, 41], seed=1)
    got = engine.generate(prompts, GREEDY)
    assert got == [_reference(tiny_llama, references, p, GREEDY.max_tokens) for p in prompts]
    assert any(s.num_decode_tokens and s.num_prefill_tokens for s in steps)


@pytest.mark.parametrize("attention", BACKENDS)
def test_prefix_hit_and_preemption_match_transformers(attention: str, tiny_llama,
                                                      tiny_source, references) -> None:
    """A prompt sharing two full blocks with an earlier one starts its prefill at the hit;
    then a cache of 6 blocks forces a preemption by recompute."""
    shared = _prompts([32], seed=2)[0]
    a, b = shared + [5, 6, 7], shared + [9, 10, 11, 12]
    engine = _engine(tiny_source, attention)
    assert engine.generate([a], GREEDY)[0] == _reference(tiny_llama, references, a, 6)
    tokens, cached = run_alone(engine, "b", b, GREEDY)
    assert cached == 32 and tokens == _reference(tiny_llama, references, b, 6)

    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    prompts = _prompts([20, 25, 18], seed=3)
    small = _engine(tiny_source, attention, kv_cache_memory_gib=6 * 8192 / 2**30,
                    enable_prefix_caching=False)
    assert small.block_manager.num_blocks == 6
    assert small.generate(prompts, params) == [
        _reference(tiny_llama, references, p, 14) for p in prompts]
    assert small.stats().preemptions_total > 0
