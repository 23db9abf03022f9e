"""Per-request sampling parameters (the engine enforces all of them except stop strings)."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from backend.schema import Schema


# Temperatures below this sample greedily (as vLLM's). Logits divided by a smaller one
# overflow float32 (7e-207 becomes 0: inf / NaN probabilities), and the draw is the argmax
# anyway.
GREEDY_BELOW = 1e-5


class SamplingParams(Schema):
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)  # below GREEDY_BELOW = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # 0 = off
    seed: int | None = None  # per-request torch.Generator -> reproducible sampling
    min_tokens: int = Field(0, ge=0)  # EOS and stop ids are masked until this many tokens exist
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()  # a JSON list becomes a tuple: immutable, hashable

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingParams":
        return cls.model_validate(data)
