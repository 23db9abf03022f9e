"""The client's per-request record and timing rules (TTFT, TPOT, ITL, E2E) for a stream.

``loadtests.client`` frames the stream with ``openai_stream.SSEFramer`` as bytes come off the
socket and hands each event to :class:`StreamMeasurement`; both the Locust user (``chat.py``)
and ``bench_ttft`` use that client. What counts as content, the end and usage are
``openai_stream``'s rules, the ones the gateway's relay applies. TPOT uses
``usage.completion_tokens``; counting content chunks is a fallback, marked
``tokens_source="chunks"`` in the record.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from openai_stream import choice_has_content, is_done, usage_of


@dataclass
class RequestRecord:
    """One request as the client saw it; a line of the raw JSONL records file.

    Times are seconds from the moment the request was handed to the socket (``t_send``),
    measured with ``time.perf_counter_ns``; ``t_start_unix`` is only a wall-clock stamp.
    """
    request_id: str
    model: str
    phase: str = "measure"                 # "warmup" records are written but never reported
    t_start_unix: float = 0.0
    status: int = 0                        # HTTP status; 0 = no response (connect error ...)
    ok: bool = False
    error: str | None = None
    ttfb_s: float | None = None            # response headers received
    ttft_s: float | None = None            # first content-bearing delta
    tpot_s: float | None = None
    e2e_s: float | None = None             # last byte of the stream
    itl_s: list[float] = field(default_factory=list)
    prompt_tokens: int | None = None       # from usage
    completion_tokens: int | None = None   # from usage, or the chunk count (fallback)
    tokens_source: str = "none"            # "usage" | "chunks" (fallback) | "none"
    content_chunks: int = 0
    finish_reason: str | None = None
    server_timings: dict | None = None     # the backend's firsttoken_timings, when relayed
    queue_s: float = 0.0                   # open loop: actual send - intended send
    arrival: str = "closed"                # closed | constant | poisson
    worker: int = 0                        # load generator process index
    kind: str = "request"

    @property
    def ttft_from_intended_s(self) -> float | None:
        """TTFT as a user arriving on schedule would see it (coordinated omission included)."""
        return None if self.ttft_s is None else self.ttft_s + self.queue_s

    def to_json(self) -> str:
        d = asdict(self)
        d["ttft_from_intended_s"] = self.ttft_from_intended_s
        return json.dumps(d, separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "RequestRecord":
        known = {f for f in cls.__dataclass_fields__}  # derived fields are recomputed
        return cls(**{k: v for k, v in d.items() if k in known})


class StreamMeasurement:
    """Applies the timing rules to one stream's events; ``finish()`` fills the record."""

    def __init__(self, record: RequestRecord, t_send_ns: int) -> None:
        self.record = record
        self._t0 = t_send_ns
        self._first_ns: int | None = None
        self._last_ns: int | None = None
        self.done = False           # saw data: [DONE]
        self.stream_error: str | None = None

    def on_event(self, data: bytes | str, t_ns: int) -> None:
        """One complete event's data, stamped when its blank line arrived."""
        if is_done(data):
            self.done = True
            return
        try:
            obj: Any = json.loads(data)
        except ValueError:
            self.stream_error = f"malformed SSE data: {data[:80]!r}"
            return
        if not isinstance(obj, dict):
            return
        if "error" in obj:  # an OpenAI-style error event mid-stream
            err = obj["error"]
            self.stream_error = str(err.get("message") if isinstance(err, dict) else err)
            return
        rec = self.record
        prompt, completion = usage_of(obj)
        if prompt is not None:
            rec.prompt_tokens = prompt
        if completion is not None:
            rec.completion_tokens = completion
            rec.tokens_source = "usage"
        if isinstance(obj.get("firsttoken_timings"), dict):
            rec.server_timings = obj["firsttoken_timings"]
        for choice in obj.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                rec.finish_reason = choice["finish_reason"]
            if choice_has_content(choice):
                self._content(t_ns)

    def _content(self, t_ns: int) -> None:
        rec = self.record
        if self._first_ns is None:
            self._first_ns = t_ns
            rec.ttft_s = (t_ns - self._t0) / 1e9
        else:
            rec.itl_s.append((t_ns - self._last_ns) / 1e9)  # type: ignore[operator]
        self._last_ns = t_ns
        rec.content_chunks += 1

    def finish(self, t_end_ns: int, status: int) -> RequestRecord:
        """Close the measurement at the last byte; decides ok/error and TPOT."""
        rec = self.record
        rec.status = status
        rec.e2e_s = (t_end_ns - self._t0) / 1e9
        if rec.tokens_source != "usage" and rec.content_chunks:
            rec.completion_tokens = rec.content_chunks
            rec.tokens_source = "chunks"  # fallback, marked: the server sent no usage
        n = rec.completion_tokens or 0
        if self._first_ns is not None and self._last_ns is not None and n > 1:
            rec.tpot_s = (self._last_ns - self._first_ns) / 1e9 / (n - 1)
        if self.stream_error:
            rec.ok, rec.error = False, self.stream_error
        elif not self.done:
            rec.ok, rec.error = False, "stream ended without data: [DONE]"
        elif self._first_ns is None:
            rec.ok, rec.error = False, "no content-bearing delta in the stream"
        else:
            rec.ok = True
        return rec
