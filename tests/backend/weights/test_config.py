"""ModelConfig parsing and the synthetic presets."""

from __future__ import annotations

import pytest

from backend.weights import load_model_source
from backend.weights.config import ModelConfig
from backend.weights.presets import PRESETS

LLAMA2_7B_HF = {  # the published config.json (transformers 4 layout)
    "architectures": ["LlamaForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None,
    "tie_word_embeddings": False, "torch_dtype": "float16", "use_cache": True,
    "vocab_size": 32000}


def _param_count(c: ModelConfig) -> int:
    attn = c.hidden_size * c.head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    per_layer = attn + mlp + 2 * c.hidden_size
    emb = c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)
    return c.num_hidden_layers * per_layer + emb + c.hidden_size


def test_presets_have_the_real_shapes():
    assert ModelConfig.from_hf_dict(LLAMA2_7B_HF) == PRESETS["llama-2-7b"]
    assert round(_param_count(PRESETS["llama-2-7b"]) / 1e9, 2) == 6.74
    assert round(_param_count(PRESETS["llama-2-13b"]) / 1e9, 2) == 13.02
    assert round(_param_count(PRESETS["llama-3-8b"]) / 1e9, 2) == 8.03
    assert PRESETS["llama-3-8b"].num_key_value_heads == 8
    tiny = PRESETS["tiny"]
    assert tiny.num_attention_heads > tiny.num_key_value_heads and tiny.num_hidden_layers <= 4


def test_synthetic_source():
    source = load_model_source("synthetic:tiny")
    assert source.name == "synthetic:tiny" and source.weights is None
    assert source.tokenizer.vocab_size == source.config.vocab_size
    assert source.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}]).endswith(
        "<|im_start|>assistant\n")


def test_transformers5_layout_and_llama3_rope():
    d = dict(LLAMA2_7B_HF, num_key_value_heads=8, torch_dtype=None, dtype="bfloat16",
             rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                              "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192})
    c = ModelConfig.from_hf_dict(d)
    assert c.rope_theta == 500000.0 and c.torch_dtype == "bfloat16"
    assert c.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                              "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}
    old = dict(LLAMA2_7B_HF, rope_theta=5e5, rope_scaling={"type": "linear", "factor": 2.0})
    assert ModelConfig.from_hf_dict(old).rope_scaling == {"rope_type": "linear", "factor": 2.0}


def test_qwen2_and_mistral():
    qwen = dict(LLAMA2_7B_HF, model_type="qwen2", num_key_value_heads=4)
    assert ModelConfig.from_hf_dict(qwen).attention_bias is True
    mistral = dict(LLAMA2_7B_HF, model_type="mistral", num_key_value_heads=8, head_dim=None)
    c = ModelConfig.from_hf_dict(mistral)
    assert c.head_dim == 128 and not c.attention_bias
    # Full attention only matches a sliding-window model up to the window: cap the context.
    v01 = dict(mistral, max_position_embeddings=32768, sliding_window=4096)
    assert ModelConfig.from_hf_dict(v01).max_position_embeddings == 4096
    assert ModelConfig.from_hf_dict(dict(v01, sliding_window=None)).max_position_embeddings \
        == 32768
    qwen_window = dict(qwen, max_position_embeddings=32768, sliding_window=4096,
                       use_sliding_window=False)
    assert ModelConfig.from_hf_dict(qwen_window).max_position_embeddings == 32768


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="ModelConfig: unknown key .bogus."):
        ModelConfig.from_dict({**PRESETS["tiny"].to_dict(), "bogus": 1})
    with pytest.raises(ValueError, match="vocab_size: Field required"):
        ModelConfig.from_dict({k: v for k, v in PRESETS["tiny"].to_dict().items()
                               if k != "vocab_size"})
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        ModelConfig.from_hf_dict(dict(LLAMA2_7B_HF, num_key_value_heads=5))
    with pytest.raises(ValueError, match="unsupported rope_scaling type 'yarn'"):
        ModelConfig.from_hf_dict(dict(LLAMA2_7B_HF, rope_scaling={"rope_type": "yarn"}))
    with pytest.raises(ValueError, match="unsupported hidden_act 'gelu'"):
        ModelConfig.from_hf_dict(dict(LLAMA2_7B_HF, hidden_act="gelu"))
    assert ModelConfig.from_dict(PRESETS["tiny"].to_dict()) == PRESETS["tiny"]
