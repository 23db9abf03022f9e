"""One request's run through the engine as a stream of events (the one streaming code path).

``Generation.events()`` drives ``engine.generate``, detokenizes incrementally, matches stop
strings, stamps times and feeds the latency histograms. Chat and completions, streamed or
not, all consume these events (see ``formatting.py``).
"""
from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, AsyncIterator, Union

from backend.engine.errors import RequestRejected, StepFailed
from .errors import APIError
from .stops import StopMatcher

if TYPE_CHECKING:
    from .state import BackendState


@dataclass(frozen=True)
class Delta:
    text: str  # never empty


@dataclass(frozen=True)
class Finish:
    reason: str  # "stop" | "length"
    usage: dict
    timings: dict  # the firsttoken_timings object


Event = Union[Delta, Finish]
_DRAIN_TIMEOUT_S = 1.0  # wait at most this long for the engine to confirm a stop-string abort


def _s(ns: int) -> float:
    return round(ns / 1e9, 6)


@dataclass
class _Clock:
    """perf_counter_ns stamps of one request (0 = not reached)."""

    received: int
    submitted: int = 0
    first_token: int = 0
    first_content: int = 0
    last_token: int = 0


def step_failed(detail: str) -> APIError:
    """The answer for a request that broke an engine step: never retried by the gateway."""
    return APIError(500, f"the engine step failed on this request ({detail})", type="server_error",
                    code="request_failed_in_step")


class Generation:
    """Runs one tokenized request; iterate ``events()`` exactly once."""

    def __init__(self, state: "BackendState", request_id: str, prompt_ids: list[int],
                 params: object, stops: tuple[str, ...], received_ns: int,
                 tokenized_ns: int) -> None:
        self._engine, self._tokenizer = state.engine, state.tokenizer
        self._metrics, self._nvtx = state.metrics, state.nvtx
        self._rid, self._prompt_ids, self._params = request_id, prompt_ids, params
        self._stops = StopMatcher(stops)
        self._clock = _Clock(received=received_ns, submitted=tokenized_ns)
        self.completion_tokens = 0

    async def events(self) -> AsyncIterator[Event]:
        stream = self._engine.generate(self._rid, self._prompt_ids, self._params)
        detok = self._tokenizer.incremental_detokenizer()
        final = None
        try:
            async for out in stream:
                text = self._take(out, detok)
                if text:
                    yield Delta(text)
                if out.finished:
                    final = out
                    break
                if self._stops.stopped:
                    self._engine.abort(self._rid)  # frees the blocks at once
                    final = await self._drain(stream)
                    break
        except RequestRejected as exc:
            raise APIError(400, exc.message, param=exc.param) from exc
        except StepFailed as exc:
            raise step_failed(str(exc)) from exc
        except (APIError, GeneratorExit):
            raise
        except Exception as exc:  # an engine failure must not read as a shorter answer
            raise APIError(500, f"engine error: {exc}", type="server_error") from exc
        finally:
            await stream.aclose()  # leaving early (client gone, error) aborts: blocks freed
            if final is None:
                self._engine.abort(self._rid)
        if self._stops.stopped:
            reason = "stop"
        elif final is not None and final.finish_reason == "error":
            raise step_failed(final.error or "")
        elif final is None or final.finish_reason == "abort":
            raise APIError(503, "the engine aborted the request", type="server_error",
                           code="engine_aborted")
        else:
            reason = final.finish_reason or "stop"
        yield Finish(reason, self._usage(final), self._finish_timings(final))

    async def _drain(self, stream: AsyncIterator) -> object | None:
        """After our abort, the engine's final output (it carries the engine's timings), if it
        comes within a moment; the answer is complete either way, so never wait long."""
        async def final() -> object | None:
            async for out in stream:
                if out.finished:
                    return out
            return None

        try:
            return await asyncio.wait_for(final(), _DRAIN_TIMEOUT_S)
        except asyncio.TimeoutError:
            return None

    def _take(self, out: object, detok: object) -> str:
        """Count and stamp the output's tokens; return the text that may be sent now."""
        now, ids, clock = time.perf_counter_ns(), out.new_token_ids, self._clock
        if ids:
            if not clock.first_token:
                clock.first_token = now
            clock.last_token = now
            self.completion_tokens += len(ids)
        with self._nvtx.range("detokenize"):
            # The engine leaves EOS / stop tokens out; the detokenizer skips special tokens.
            text = detok.push(ids[0]) if len(ids) == 1 else "".join(map(detok.push, ids))
            released = self._stops.push(text) if text else ""
            if out.finished and not self._stops.stopped:
                released += self._stops.push(detok.flush())
                released += self._stops.flush()
        if released and not clock.first_content:
            clock.first_content = now
        return released

    def _usage(self, final: object | None) -> dict:
        prompt = len(self._prompt_ids)
        cached = final.num_cached_tokens if final is not None else 0
        return {"prompt_tokens": prompt, "completion_tokens": self.completion_tokens,
                "total_tokens": prompt + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _finish_timings(self, final: object | None) -> dict:
        c, end = self._clock, time.perf_counter_ns()
        eng = final.timings if final is not None else None
        first = c.first_content or c.first_token or end
        last = c.last_token or end
        timings = {
            "tokenize_s": _s(c.submitted - c.received),
            # The engine's split from its final output; without one (it never came) all time
            # until the first token counts as prefill.
            "queue_s": round(eng.queue_s, 6) if eng else 0.0,
            "prefill_s": round(eng.prefill_s, 6) if eng else _s((c.first_token or end)
                                                                 - c.submitted),
            "first_token_s": _s(first - c.received),
            "decode_s": _s(max(last - first, 0)),
            "e2e_s": _s(end - c.received),
            "prompt_tokens": len(self._prompt_ids),
            "cached_prompt_tokens": final.num_cached_tokens if final is not None else 0,
        }
        self._observe(timings, last)
        return timings

    def _observe(self, t: dict, last_ns: int) -> None:
        m, c = self._metrics, self._clock
        if c.first_content:
            m.ttft.observe(t["first_token_s"])
        if self.completion_tokens > 1 and c.first_token:
            m.tpot.observe((last_ns - c.first_token) / 1e9 / (self.completion_tokens - 1))
        m.queue.observe(t["queue_s"])
        m.prefill.observe(t["prefill_s"])
        m.e2e.observe(t["e2e_s"])
