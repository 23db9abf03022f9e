"""Synthetic presets: real model shapes with random weights, for benchmarks and fast tests.

`synthetic:<preset>` loads one of these with a byte-level tokenizer and no weights (the model
keeps its random init), so nothing needs downloading.
"""

from __future__ import annotations

from backend.weights.config import ModelConfig

_LLAMA3_1_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _cfg(**kw: object) -> ModelConfig:
    base: dict = dict(rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                      tie_word_embeddings=False, attention_bias=False, torch_dtype="float32")
    base.update(kw)
    if "head_dim" not in base:
        base["head_dim"] = base["hidden_size"] // base["num_attention_heads"]
    return ModelConfig.from_dict(base)


PRESETS: dict[str, ModelConfig] = {
    # Real shapes (from the published config.json files).
    "llama-2-7b": _cfg(vocab_size=32000, hidden_size=4096, intermediate_size=11008,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
                       max_position_embeddings=4096, torch_dtype="float16"),
    "llama-2-13b": _cfg(vocab_size=32000, hidden_size=5120, intermediate_size=13824,
                        num_hidden_layers=40, num_attention_heads=40, num_key_value_heads=40,
                        max_position_embeddings=4096, torch_dtype="float16"),
    "llama-3-8b": _cfg(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                       num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                       rope_theta=500000.0, max_position_embeddings=8192,
                       torch_dtype="bfloat16"),
    "llama-3.1-8b": _cfg(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                         rope_theta=500000.0, rope_scaling=_LLAMA3_1_ROPE,
                         max_position_embeddings=131072, torch_dtype="bfloat16"),
    "smollm2-135m": _cfg(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         rope_theta=100000.0, max_position_embeddings=8192,
                         tie_word_embeddings=True, torch_dtype="bfloat16"),
    # Tiny ones for fast tests: GQA, a few layers, small hidden size.
    "tiny": _cfg(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024),
    "tiny-llama3": _cfg(vocab_size=512, hidden_size=64, intermediate_size=128,
                        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                        rope_theta=500000.0,
                        rope_scaling={**_LLAMA3_1_ROPE, "original_max_position_embeddings": 256},
                        max_position_embeddings=2048),
    "tiny-qwen2": _cfg(vocab_size=512, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       rms_norm_eps=1e-6, max_position_embeddings=1024,
                       tie_word_embeddings=True, attention_bias=True),
    "small": _cfg(vocab_size=4096, hidden_size=256, intermediate_size=768, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=4096),
}


def preset_config(preset: str) -> ModelConfig:
    try:
        return PRESETS[preset]
    except KeyError:
        raise ValueError(f"unknown synthetic preset {preset!r}; "
                         f"choose one of: {', '.join(sorted(PRESETS))}") from None
