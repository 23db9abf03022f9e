"""ModelConfig: the shape of a Llama-family decoder, in Hugging Face config.json field names."""

from __future__ import annotations

import logging
from typing import Annotated, Any

from pydantic import Field, ValidationError, model_validator

from backend.schema import Schema, describe

log = logging.getLogger(__name__)

# model_type values whose architecture backend/model.py implements.
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")
SUPPORTED_ROPE_TYPES = ("llama3", "linear")


Positive = Annotated[int, Field(strict=True, ge=1)]  # a bool or "8" is not a size


class ModelConfig(Schema):
    vocab_size: Positive
    hidden_size: Positive
    intermediate_size: Positive
    num_hidden_layers: Positive
    num_attention_heads: Positive
    num_key_value_heads: Positive
    head_dim: Positive
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None  # None, or {"rope_type": "llama3"|"linear", "factor": ..., ...}
    max_position_embeddings: Positive
    tie_word_embeddings: bool
    attention_bias: bool
    torch_dtype: str  # dtype the weights were stored in ("float32", "bfloat16", ...)

    @model_validator(mode="after")
    def _consistent(self) -> ModelConfig:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling.get("rope_type")
            if rope_type not in SUPPORTED_ROPE_TYPES:
                raise ValueError(f"unsupported rope_scaling type {rope_type!r}; "
                                 f"supported: {', '.join(SUPPORTED_ROPE_TYPES)}")
        return self

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Our own serialised form (the cache, presets): every field, no other keys."""
        try:
            return cls.model_validate(d)
        except ValidationError as exc:
            raise ValueError(f"ModelConfig: {describe(exc)}") from None

    @classmethod
    def from_hf_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """A Hugging Face config.json (transformers 4.x or 5.x layout) of a llama, mistral or
        qwen2 model. Keys we do not use (dropout, init range, ...) are ignored there by design:
        config.json carries many."""
        model_type = d.get("model_type", "llama")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {model_type!r}; "
                             f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
        act = d.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"unsupported hidden_act {act!r} (only silu)")
        if d.get("mlp_bias"):
            raise ValueError("mlp_bias=true is not supported")
        hidden, heads = int(d["hidden_size"]), int(d["num_attention_heads"])
        head_dim = d.get("head_dim") or hidden // heads
        rope_theta, rope_scaling = _rope_from_hf(d)
        # Qwen2 always has q/k/v biases; its config.json does not say so.
        attention_bias = bool(d.get("attention_bias", model_type == "qwen2"))
        dtype = d.get("dtype") or d.get("torch_dtype") or "float32"
        max_positions = int(d.get("max_position_embeddings", 2048))
        window = d.get("sliding_window")
        if window and d.get("use_sliding_window", model_type == "mistral") and \
                int(window) < max_positions:
            # Our attention is full (no window). Up to the window both agree, so serving only
            # that much context keeps outputs identical to the reference (Mistral 7B v0.1).
            log.warning("sliding_window=%s: limiting the context to %s tokens", window, window)
            max_positions = int(window)
        return cls(
            vocab_size=int(d["vocab_size"]), hidden_size=hidden,
            intermediate_size=int(d["intermediate_size"]),
            num_hidden_layers=int(d["num_hidden_layers"]), num_attention_heads=heads,
            num_key_value_heads=int(d.get("num_key_value_heads") or heads),
            head_dim=int(head_dim), rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta, rope_scaling=rope_scaling,
            max_position_embeddings=max_positions,
            tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
            attention_bias=attention_bias, torch_dtype=str(dtype).replace("torch.", ""))


def _rope_from_hf(d: dict[str, Any]) -> tuple[float, dict | None]:
    """(rope_theta, rope_scaling) from either `rope_theta`+`rope_scaling` (transformers 4) or
    `rope_parameters` (transformers 5)."""
    params = dict(d.get("rope_parameters") or {})
    scaling = dict(d.get("rope_scaling") or {}) or params
    theta = float(d.get("rope_theta") or params.get("rope_theta") or 10000.0)
    scaling.pop("rope_theta", None)
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    scaling.pop("type", None)
    if not scaling or scaling.get("rope_type") in (None, "default"):
        return theta, None
    return theta, scaling
