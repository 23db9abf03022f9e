"""Turn generation events into OpenAI chunks, and chunks into a non-stream response.

Streaming writes each chunk as an SSE ``data:`` line; a non-stream request renders the very
same chunks and merges them with ``aggregate`` — one code path for all four request shapes.
A stream's content chunks, one per token and request, are not built as dicts: their bytes
are the bytes of the same chunk rendered once per request around a placeholder text, with
the JSON-escaped delta text in its place (``ChunkFormatter.frame``).
"""
from __future__ import annotations

import contextlib
import json
import time
from typing import AsyncIterator

from .generation import Delta, Event, Finish
from .protocol import Kind

TIMINGS_FIELD = "firsttoken_timings"
# json.dumps(text) for a str, without its dispatch (the C function json.dumps calls with
# ensure_ascii, the default): the very same bytes
_json_string = json.encoder.encode_basestring_ascii
_PLACEHOLDER = "\x00"  # json.dumps writes it as "\u0000": never a real delta's whole text


def sse_event(payload: dict | str) -> bytes:
    """One SSE event: ``data: <compact JSON, or the string as is>`` and a blank line."""
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n".encode()


SSE_DONE = sse_event("[DONE]")


class ChunkFormatter:
    """OpenAI chunk shapes for one request: ``chat.completion.chunk`` or ``text_completion``."""

    def __init__(self, kind: Kind, request_id: str, model: str, include_usage: bool) -> None:
        self.kind = kind
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{request_id}"
        self.model = model
        self.created = int(time.time())
        self.include_usage = include_usage
        # the SSE bytes of a content chunk before and after its text's JSON string; the
        # last match is the text (only the choice's closing keys and usage follow it)
        before, _, after = sse_event(self.delta(Delta(_PLACEHOLDER))).rpartition(
            json.dumps(_PLACEHOLDER).encode())
        self._text_frame = (before, after)

    def _chunk(self, choices: list[dict]) -> dict:
        chunk = {"id": self.id, "object": "chat.completion.chunk" if self.kind == "chat"
                 else "text_completion", "created": self.created, "model": self.model,
                 "system_fingerprint": None, "choices": choices}
        if self.include_usage:  # OpenAI: null on every chunk but the usage chunk
            chunk["usage"] = None
        return chunk

    def _choice(self, content: str | None, finish_reason: str | None,
                role: bool = False) -> dict:
        if self.kind == "completion":
            return {"index": 0, "text": content or "", "logprobs": None,
                    "finish_reason": finish_reason}
        delta: dict = {}
        if role:
            delta = {"role": "assistant", "content": ""}
        elif content is not None:
            delta = {"content": content}
        return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}

    def start(self) -> list[dict]:
        """Chat streams open with a role-only chunk; completions have none."""
        return [self._chunk([self._choice(None, None, role=True)])] if self.kind == "chat" \
            else []

    def delta(self, event: Delta) -> dict:
        return self._chunk([self._choice(event.text, None)])

    def finish(self, event: Finish) -> list[dict]:
        """The finish chunk, then the usage chunk if asked for; the last carries the timings."""
        chunks = [self._chunk([self._choice(None, event.reason)])]
        if self.include_usage:
            usage_chunk = self._chunk([])
            usage_chunk["usage"] = event.usage
            chunks.append(usage_chunk)
        chunks[-1][TIMINGS_FIELD] = event.timings
        return chunks

    def frame(self, event: Event) -> bytes:
        """A streamed event's SSE bytes: ``sse_event`` of its chunks (``delta``/``finish``)."""
        if isinstance(event, Delta):
            before, after = self._text_frame
            return before + _json_string(event.text).encode() + after
        return b"".join(sse_event(chunk) for chunk in self.finish(event))

    async def render(self, events: AsyncIterator[Event]) -> AsyncIterator[dict]:
        # aclosing: closing the chunks closes the events at once, which aborts the engine
        # request (not whenever the garbage collector gets to it).
        async with contextlib.aclosing(events):
            for chunk in self.start():
                yield chunk
            async for event in events:
                if isinstance(event, Delta):
                    yield self.delta(event)
                else:
                    for chunk in self.finish(event):
                        yield chunk


def aggregate(chunks: list[dict]) -> dict:
    """Merge a request's chunks (rendered with include_usage) into a non-stream response."""
    first, kind = chunks[0], ("chat" if chunks[0]["object"] == "chat.completion.chunk"
                              else "completion")
    text, finish_reason, usage, timings = [], None, None, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            piece = choice["delta"].get("content") if kind == "chat" else choice["text"]
            text.append(piece or "")
            finish_reason = choice["finish_reason"] or finish_reason
        usage = chunk.get("usage") or usage
        timings = chunk.get(TIMINGS_FIELD) or timings
    content = "".join(text)
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": content,
                                          "refusal": None},
                  "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": content, "logprobs": None, "finish_reason": finish_reason}
    return {"id": first["id"], "object": "chat.completion" if kind == "chat"
            else "text_completion", "created": first["created"], "model": first["model"],
            "system_fingerprint": None, "choices": [choice], "usage": usage,
            TIMINGS_FIELD: timings}
