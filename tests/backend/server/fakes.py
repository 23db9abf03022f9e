"""A small in-loop fake of AsyncEngine (the ARCHITECTURE.md interface) for server tests.

It "generates" a fixed reply through the real byte-level tokenizer, one token per step, with
a paged-cache-like block count so waiting, admission and freeing on abort can be asserted.
"""
from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Callable

from backend.engine.errors import RequestRejected
from backend.engine.outputs import EngineStats, RequestOutput, RequestTimings, StepStats
from backend.engine.sampling import SamplingParams

REPLY = "Hello! The capital of France is Paris."


class FakeEngine:
    def __init__(self, config: object, source: object,
                 step_observer: Callable[[StepStats], None] | None = None, *,
                 reply: str = REPLY, token_delay_s: float = 0.002, blocks_total: int = 64,
                 max_model_len: int = 256, fail_after: int | None = None) -> None:
        self.tokenizer = source.tokenizer
        self.reply_ids = self.tokenizer.encode(reply)
        self.observer = step_observer
        self.token_delay_s = token_delay_s
        self.block_size = getattr(config, "block_size", 16)
        self.blocks_total = blocks_total
        self.blocks_used = 0
        self.max_model_len = max_model_len
        self.fail_after = fail_after  # raise an engine error after this many tokens
        self.running = 0
        self.waiting = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.aborted: set[str] = set()
        self.seen_params: list[SamplingParams] = []
        self._cond: asyncio.Condition | None = None
        self.started = False

    async def start(self) -> None:
        self._cond = asyncio.Condition()
        self.started = True

    async def stop(self) -> None:
        self.started = False

    def _blocks(self, prompt_len: int, params: SamplingParams) -> int:
        return -(-(prompt_len + params.max_tokens) // self.block_size)

    def check_request(self, prompt_len: int, params: SamplingParams) -> None:
        if self._blocks(prompt_len, params) > self.blocks_total:
            raise RequestRejected(f"request needs {self._blocks(prompt_len, params)} KV blocks "
                                  f"but the cache has {self.blocks_total}", "max_tokens")

    def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    def stats(self) -> EngineStats:
        return EngineStats(running=self.running, waiting=self.waiting,
                           kv_blocks_used=self.blocks_used, kv_blocks_total=self.blocks_total,
                           preemptions_total=0, prompt_tokens_total=self.prompt_tokens_total,
                           generation_tokens_total=self.generation_tokens_total,
                           attention_kernel="fake")

    def _next_token(self, i: int, params: SamplingParams) -> tuple[int, str | None]:
        """Token i of the reply; after the reply, EOS (or the reply again with ignore_eos)."""
        eos = self.tokenizer.eos_token_ids[0]
        if i < len(self.reply_ids):
            tok = self.reply_ids[i]
        elif params.ignore_eos or i < params.min_tokens:
            tok = self.reply_ids[i % len(self.reply_ids)]
        else:
            return eos, "stop"
        if tok in params.stop_token_ids and i + 1 >= params.min_tokens:
            return tok, "stop"
        return tok, ("length" if i + 1 >= params.max_tokens else None)

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        arrival, need = time.perf_counter(), self._blocks(len(prompt_token_ids), params)
        self.seen_params.append(params)
        async with self._cond:
            self.waiting += 1
            try:  # a full cache makes the request wait, never fail
                await self._cond.wait_for(lambda: self.blocks_total - self.blocks_used >= need)
            finally:
                self.waiting -= 1
            self.blocks_used += need
            self.running += 1
        scheduled = time.perf_counter()
        self.prompt_tokens_total += len(prompt_token_ids)
        first = None
        try:
            for i in range(params.max_tokens):
                if request_id in self.aborted:  # like the real engine: a final "abort" output
                    now = time.perf_counter()
                    yield RequestOutput(request_id, [], True, "abort", len(prompt_token_ids), 0,
                                        RequestTimings(scheduled - arrival, 0.0, 0.0, 0.0,
                                                       now - arrival))
                    return
                await asyncio.sleep(self.token_delay_s)
                if self.fail_after is not None and i >= self.fail_after:
                    raise RuntimeError("simulated engine failure")
                if self.observer:
                    self.observer(StepStats(self.running, 0, 1, self.token_delay_s))
                tok, reason = self._next_token(i, params)
                self.generation_tokens_total += 1
                now = time.perf_counter()
                first = first or now
                timings = None
                if reason:
                    timings = RequestTimings(scheduled - arrival, first - scheduled,
                                             first - arrival, now - first, now - arrival)
                # Like the real engine: an EOS / stop token ends the stream but is not output.
                new = [] if reason == "stop" else [tok]
                yield RequestOutput(request_id, new, reason is not None, reason,
                                    len(prompt_token_ids), 0, timings)
                if reason:
                    return
        finally:
            self.blocks_used -= need
            self.running -= 1
            async with self._cond:
                self._cond.notify_all()


def fake_factory(**kwargs: object) -> Callable[..., FakeEngine]:
    """An engine_factory for create_app that builds a FakeEngine with these options."""
    made: list[FakeEngine] = []

    def factory(config: object, source: object, step_observer: Callable) -> FakeEngine:
        engine = FakeEngine(config, source, step_observer, **kwargs)
        made.append(engine)
        return engine

    factory.made = made  # type: ignore[attr-defined]
    return factory
