"""Per-request sampling parameters (the engine enforces all of them except stop strings)."""
from __future__ import annotations

from typing import Any

from pydantic import Field

from backend.schema import Schema


class SamplingParams(Schema):
    max_tokens: int = Field(16, ge=1)
    temperature: float = Field(1.0, ge=0.0)  # 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)  # 0 = off
    seed: int | None = None  # per-request torch.Generator -> reproducible sampling
    min_tokens: int = Field(0, ge=0)  # EOS and stop ids are masked until this many tokens exist
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()  # a JSON list becomes a tuple: immutable, hashable

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "SamplingParams":
        return cls.model_validate(data)
