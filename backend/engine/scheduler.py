"""Iteration-level scheduler: which sequences run this step and how many tokens each.

Continuous mode, every step, under ``max_num_batched_tokens`` and ``max_num_seqs``:
1. decodes of running sequences first (one token each), so long prompts never stall streams;
   a decode that needs a new block and finds none preempts the newest running sequence
   (recompute: its blocks are freed and it goes back to the front of the waiting queue);
2. the rest of prefills already in progress (chunked: a prompt may span steps);
3. new sequences from the waiting queue, first come first served, while the budget, the
   sequence cap and the free blocks allow (admission allocates blocks for the whole prompt).
2. and 3. together carry at most ``max_prefill_seqs`` chunks, where the engine sets it: the
chunk slots of its CUDA graphs. Prompts served mostly from the prefix cache cost a few tokens
each, so a burst of them would otherwise pack dozens of chunks into one step, and such a step
runs outside the graphs: hundreds of milliseconds of host time with the GPU idle.
Static mode admits a batch only when nothing runs and lets it run to completion: the
baseline that continuous batching is measured against.

Two knobs trade TTFT against TPOT (docs/BACKEND-ENGINE.md, "Scheduling for a TTFT SLO"):
* ``max_prefill_tokens`` (unset: ``config.prefill_budget``'s default) caps the prefill tokens
  (2. and 3. together) of one step, below what the decodes leave of ``max_num_batched_tokens``:
  a short step keeps the decodes' TPOT steady, long prompts are chunked over more steps.
* ``prefill_priority``: a step that has prefill work (a waiting prompt or a chunk under way)
  carries only prefill, up to the prefill budget; the running decodes get their next token
  in the step after it, which always schedules every decode first. So a decode is skipped
  by at most one step in a row, however many prompts keep arriving (no starvation).
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from backend.engine.block_manager import BlockManager
from backend.engine.config import prefill_budget
from backend.engine.sequence import Sequence, SeqStatus


@dataclass
class ScheduledBatch:
    decodes: list[Sequence]
    prefills: list[tuple[Sequence, int]]  # (sequence, number of tokens this step)

    @property
    def num_seqs(self) -> int:
        return len(self.decodes) + len(self.prefills)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(n for _, n in self.prefills)

    def sampled_seqs(self) -> list[Sequence]:
        """The sequences that get a sampled token this step, in logits-row order: every
        decode, then each prefill whose chunk reaches its last token. Valid until the step
        advances ``num_computed``."""
        return self.decodes + [s for s, n in self.prefills if s.num_computed + n == len(s)]


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int,
                 max_num_batched_tokens: int, static: bool,
                 max_prefill_tokens: int | None = None, prefill_priority: bool = False,
                 max_prefill_seqs: int | None = None) -> None:
        self.bm = block_manager
        self.max_prefill_seqs = max_prefill_seqs if not static else None
        # Never more running sequences than tokens in a step: every running decode then
        # gets its token in every step that schedules decodes (none starves behind the budget).
        self.max_num_seqs = min(max_num_seqs, max_num_batched_tokens)
        self.max_tokens = max_num_batched_tokens
        self.static = static
        self.configure(max_prefill_tokens, prefill_priority)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.preemptions_total = 0
        self.cached_prompt_tokens_total = 0  # prompt tokens the prefix cache served at admission
        # the previous step was prefill-only while decodes were running: this one must
        # carry them (the bound on how long prefill priority can hold a decode back)
        self._decodes_held = False

    def configure(self, max_prefill_tokens: int | None, prefill_priority: bool) -> None:
        """Set the step policy (benchmarks change it between runs of one engine)."""
        if max_prefill_tokens is not None and not 1 <= max_prefill_tokens <= self.max_tokens:
            raise ValueError(f"max_prefill_tokens must be between 1 and max_num_batched_tokens "
                             f"({self.max_tokens}); got {max_prefill_tokens}")
        if prefill_priority and self.static:
            raise ValueError("prefill_priority needs continuous scheduling")
        self.max_prefill = prefill_budget(max_prefill_tokens, self.max_tokens)
        self.prefill_priority = prefill_priority

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        if self.prefill_priority and not self._decodes_held and self._has_prefill_work():
            batch = ScheduledBatch([], [])
            self._schedule_prefills(batch, self.max_prefill)
            if batch.prefills:  # else (no blocks for the next prompt) a normal step
                self._decodes_held = any(s.is_decode for s in self.running)
                return batch
        self._decodes_held = False
        batch = ScheduledBatch([], [])
        budget = self._schedule_decodes(batch, self.max_tokens)
        self._schedule_prefills(batch, min(budget, self.max_prefill))
        return batch

    def _has_prefill_work(self) -> bool:
        return bool(self.waiting) or any(not s.is_decode for s in self.running)

    def _schedule_prefills(self, batch: ScheduledBatch, budget: int) -> None:
        """Chunks of prefills under way, then new admissions, under ``budget`` tokens."""
        for seq in self.running:
            if budget == 0 or self._chunks_full(batch):
                break
            if seq.status is SeqStatus.RUNNING and not seq.is_decode:
                n = min(seq.num_uncomputed, budget)
                batch.prefills.append((seq, n))
                budget -= n
        if not self.static or not self.running:
            self._admit(batch, budget)

    def _chunks_full(self, batch: ScheduledBatch) -> bool:
        return self.max_prefill_seqs is not None and \
            len(batch.prefills) >= self.max_prefill_seqs

    def _schedule_decodes(self, batch: ScheduledBatch, budget: int) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            if not seq.is_decode:
                i += 1
                continue
            while not self.bm.can_append(seq):
                victim = self.running[-1]
                self.preempt(victim)
                if victim is seq:
                    break
            if seq.status is not SeqStatus.RUNNING:
                break  # seq preempted itself: everything after it is gone as well
            self.bm.append_slot(seq)
            batch.decodes.append(seq)
            budget -= 1
            i += 1
        return budget

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        now = time.perf_counter_ns()
        while self.waiting and len(self.running) < self.max_num_seqs:
            if budget == 0 and not self.static or self._chunks_full(batch):
                break
            seq = self.waiting[0]
            if not self.bm.can_allocate(seq):
                break  # first come first served: later requests wait behind it
            self.waiting.popleft()
            cached = self.bm.allocate(seq)
            if seq.first_scheduled_ns is None:
                seq.first_scheduled_ns = now
                seq.num_cached_tokens = cached
                self.cached_prompt_tokens_total += cached
            seq.num_computed = cached
            seq.status = SeqStatus.RUNNING
            self.running.append(seq)
            n = min(seq.num_uncomputed, budget)
            if n > 0:
                batch.prefills.append((seq, n))
                budget -= n

    def preempt(self, seq: Sequence) -> None:
        """Recompute-style preemption: drop the K/V, requeue at the front."""
        self.running.remove(seq)
        self.bm.free_seq(seq)
        seq.num_computed = 0
        seq.status = SeqStatus.WAITING
        self.waiting.appendleft(seq)
        self.preemptions_total += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        if seq.status is SeqStatus.RUNNING:
            self.running.remove(seq)
            self.bm.free_seq(seq)
        elif seq.status is SeqStatus.WAITING:
            self.waiting.remove(seq)
        seq.status = SeqStatus.FINISHED
        seq.finish_reason = reason
        seq.finished_ns = time.perf_counter_ns()
