"""One request inside the engine: its tokens, KV blocks, progress and timing stamps."""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from backend.engine.sampling import SamplingParams


class SeqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # identity semantics: sequences live in queues and sets
class Sequence:
    request_id: str
    # prompt followed by the generated tokens; a token sampled by a step whose ids the host
    # has not read yet is a negative placeholder (engine.step_inputs.pending_token)
    token_ids: list[int]
    num_prompt_tokens: int
    params: SamplingParams
    arrival_ns: int = field(default_factory=time.perf_counter_ns)
    status: SeqStatus = SeqStatus.WAITING
    block_table: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens whose K/V are in the cache
    num_cached_tokens: int = 0  # prompt tokens served by the prefix cache at first admission
    num_hashed_blocks: int = 0  # leading full blocks registered in the prefix cache
    num_emitted: int = 0  # generated tokens already handed to the caller
    finish_reason: str | None = None
    generator: torch.Generator | None = None  # seeded requests only
    first_scheduled_ns: int | None = None
    first_token_ns: int | None = None
    finished_ns: int | None = None

    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed

    @property
    def is_decode(self) -> bool:
        """Only the newest token lacks K/V: one-token step that samples."""
        # num_uncomputed == 1 and num_generated > 0, spelled out: the scheduler asks this
        # of every running sequence in every step
        n = len(self.token_ids)
        return n - self.num_computed == 1 and n > self.num_prompt_tokens

    def take_new_tokens(self, end: int | None = None) -> list[int]:
        """Generated tokens not handed out yet, up to index ``end`` of token_ids (the
        tokens after it may still be pending placeholders)."""
        end = len(self.token_ids) if end is None else end
        start = self.num_prompt_tokens + self.num_emitted
        self.num_emitted = end - self.num_prompt_tokens
        return self.token_ids[start:end]
