"""Tiny random Hugging Face checkpoints, built in-process, as references for the engine."""
from __future__ import annotations

from types import SimpleNamespace

import torch

from backend.weights.config import ModelConfig
from backend.weights.loader import ModelSource

TINY_EOS = 2


def tiny_hf_model(kind: str = "llama", seed: int = 0):
    """A random HF model: llama (GQA 4:2, untied) or qwen2 (q/k/v bias, tied)."""
    import transformers

    torch.manual_seed(seed)
    common = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-6, eos_token_id=TINY_EOS, bos_token_id=1)
    if kind == "llama":
        cfg = transformers.LlamaConfig(**common, tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "llama3":
        rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
                "rope_theta": 500000.0}
        cfg = transformers.LlamaConfig(**common, tie_word_embeddings=False,
                                       rope_parameters=rope)
        model = transformers.LlamaForCausalLM(cfg)
    elif kind == "qwen2":
        cfg = transformers.Qwen2Config(**common, tie_word_embeddings=True)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        raise ValueError(kind)
    model.eval()
    # HF inits norms to 1 and biases to 0: randomise them so the test can see them.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model


def source_from_hf(model, eos: tuple[int, ...] = (TINY_EOS,)) -> ModelSource:
    config = ModelConfig.from_hf_dict(model.config.to_dict())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return ModelSource(name="tiny", config=config,
                       tokenizer=SimpleNamespace(eos_token_ids=eos),
                       weights=lambda: iter(state.items()))


@torch.no_grad()
def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    """n greedy tokens from a HF model with its contiguous KV cache, EOS not special: the
    reference for paged-cache decoding with ignore_eos."""
    out = model(torch.tensor([prompt]), use_cache=True)
    past, tokens = out.past_key_values, []
    for _ in range(n):
        tokens.append(int(out.logits[0, -1].argmax()))
        out = model(torch.tensor([[tokens[-1]]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
    return tokens


def run_alone(engine, request_id: str, prompt: list[int], params) -> tuple[list[int], int]:
    """Add one request to an idle engine and step it to the end: (its tokens, the cached
    prompt tokens its last output reports)."""
    engine.add_request(request_id, prompt, params)
    tokens, cached = [], None
    while engine.has_unfinished():
        for o in engine.step():
            tokens.extend(o.new_token_ids)
            cached = o.num_cached_tokens
    return tokens, cached


def track_engines(monkeypatch) -> list:
    """Record every LLMEngine built during a test (AsyncEngine's included)."""
    from backend.engine.llm_engine import LLMEngine

    engines: list = []
    original = LLMEngine.__init__

    def init(self, *args, **kwargs) -> None:
        original(self, *args, **kwargs)
        engines.append(self)

    monkeypatch.setattr(LLMEngine, "__init__", init)
    return engines


def assert_all_blocks_free(engines: list) -> None:
    for engine in engines:
        bm = engine.block_manager
        assert not engine.has_unfinished(), "a test left requests in the engine"
        assert bm.num_used == 0 and bm.num_free == bm.num_blocks, "KV blocks still held"
