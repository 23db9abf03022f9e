"""One request's timestamps and outcome, and the JSONL/CSV request log they are written to.

All intervals use ``time.perf_counter_ns`` from the moment the gateway's handler saw the
request; ``t_received`` is the only wall-clock (unix seconds) value.
"""
from __future__ import annotations

import asyncio
import csv
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gateway.appendlog import AppendFile

LOG_FIELDS = (
    "request_id", "key_name", "model", "provider", "upstream_model", "endpoint", "stream",
    "status", "error", "t_received", "ttft_s", "tpot_s", "e2e_s", "overhead_s",
    "overhead_ttft_s", "upstream_ttfb_s", "itl_mean_s", "itl_max_s", "content_chunks",
    "prompt_tokens", "completion_tokens", "tokens_estimated", "retries", "finish_reason",
    "deployment", "route_reason",
)


def _s(ns: int | None) -> float | None:
    return None if ns is None else round(ns / 1e9, 9)


@dataclass
class RequestRecord:
    request_id: str
    endpoint: str
    t0_ns: int = field(default_factory=time.perf_counter_ns)
    t_received: float = field(default_factory=time.time)
    key_name: str | None = None
    model: str | None = None
    provider: str | None = None
    upstream_model: str | None = None
    stream: bool = False
    status: int = 0
    error: str | None = None
    retries: int = 0
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens_estimated: bool = False
    # timestamps (perf_counter_ns)
    t_sent_ns: int | None = None         # first upstream attempt handed to the client library
    t_headers_ns: int | None = None      # upstream response headers of the used attempt
    t_attempt_ns: int | None = None      # start of the used attempt (for ttfb)
    t_first_ns: int | None = None        # first content-bearing delta written to the client
    t_last_ns: int | None = None         # last content-bearing delta written
    t_end_ns: int | None = None          # last byte written
    relay_ns: int = 0                    # sum of (written - read) over relayed events
    relay_first_ns: int = 0              # relay time up to and including the first content
    content_chunks: int = 0
    itl_sum_ns: int = 0
    itl_max_ns: int = 0
    # routing (routing.py): "<provider>/<model>" that served, why it was chosen, and how many
    # other requests it had in flight then
    deployment: str | None = None
    route_reason: str | None = None
    route_level: int = 0

    def content(self, t_read_ns: int, t_written_ns: int) -> int | None:
        """Note a content chunk handed to the client's socket at t_written; returns the ITL
        gap in ns (or None)."""
        self.content_chunks += 1
        gap = None
        if self.t_first_ns is None:
            self.t_first_ns = t_written_ns
            self.relay_first_ns = self.relay_ns
        else:
            gap = t_written_ns - (self.t_last_ns or t_written_ns)
            self.itl_sum_ns += gap
            if gap > self.itl_max_ns:
                self.itl_max_ns = gap
        self.t_last_ns = t_written_ns
        return gap

    # ---- derived ---------------------------------------------------------------------------
    def ttft_ns(self) -> int | None:
        return None if self.t_first_ns is None else self.t_first_ns - self.t0_ns

    def tpot_ns(self) -> int | None:
        n = self.completion_tokens
        if self.t_first_ns is None or self.t_last_ns is None or not n or n < 2:
            return None
        return (self.t_last_ns - self.t_first_ns) // (n - 1)

    def e2e_ns(self) -> int | None:
        return None if self.t_end_ns is None else self.t_end_ns - self.t0_ns

    def pre_ns(self) -> int | None:
        return None if self.t_sent_ns is None else self.t_sent_ns - self.t0_ns

    def overhead_ns(self) -> int | None:
        pre = self.pre_ns()
        return None if pre is None else pre + self.relay_ns

    def overhead_ttft_ns(self) -> int | None:
        pre = self.pre_ns()
        return None if pre is None or self.t_first_ns is None else pre + self.relay_first_ns

    def ttfb_ns(self) -> int | None:
        if self.t_headers_ns is None or self.t_attempt_ns is None:
            return None
        return self.t_headers_ns - self.t_attempt_ns

    def to_log(self) -> dict[str, Any]:
        gaps = self.content_chunks - 1
        return {
            "request_id": self.request_id, "key_name": self.key_name, "model": self.model,
            "provider": self.provider, "upstream_model": self.upstream_model,
            "endpoint": self.endpoint, "stream": self.stream, "status": self.status,
            "error": self.error, "t_received": round(self.t_received, 6),
            "ttft_s": _s(self.ttft_ns()), "tpot_s": _s(self.tpot_ns()), "e2e_s": _s(self.e2e_ns()),
            "overhead_s": _s(self.overhead_ns()), "overhead_ttft_s": _s(self.overhead_ttft_ns()),
            "upstream_ttfb_s": _s(self.ttfb_ns()),
            "itl_mean_s": _s(self.itl_sum_ns // gaps) if gaps > 0 else None,
            "itl_max_s": _s(self.itl_max_ns) if gaps > 0 else None,
            "content_chunks": self.content_chunks, "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "tokens_estimated": self.tokens_estimated, "retries": self.retries,
            "finish_reason": self.finish_reason, "deployment": self.deployment,
            "route_reason": self.route_reason,
        }


MAX_FIELD_CHARS = 400  # model names, error messages: a line stays short and csv-readable
TRUNCATED = "...[truncated]"


def _bounded(value: Any) -> Any:
    """A string field cut to MAX_FIELD_CHARS (with a marker) and made encodable as UTF-8
    (a lone surrogate becomes its ``\\udXXX`` escape), so no row can break either file."""
    if not isinstance(value, str):
        return value
    if len(value) > MAX_FIELD_CHARS:
        value = value[:MAX_FIELD_CHARS - len(TRUNCATED)] + TRUNCATED
    if not value.isascii():
        value = value.encode("utf-8", "backslashreplace").decode("utf-8")
    return value


class RequestLog:
    """Appends one JSON line (and optionally one CSV row) per request.

    Lines go to a buffered file and are flushed every ``flush_s`` and at close, so the hot path
    costs a json.dumps and a buffer append, not a syscall.
    """

    def __init__(self, jsonl: str | None, csv_path: str | None, flush_s: float = 1.0) -> None:
        self._jsonl: AppendFile | None = self._open(jsonl)
        self._csv_file: AppendFile | None = None
        self._csv: Any = None
        if csv_path:
            new = not Path(csv_path).exists() or Path(csv_path).stat().st_size == 0
            self._csv_file = self._open(csv_path)
            self._csv = csv.DictWriter(self._csv_file, fieldnames=LOG_FIELDS)
            if new:
                self._csv.writeheader()
        self._flush_s = flush_s
        self._task: asyncio.Task | None = None

    @staticmethod
    def _open(path: str | None) -> AppendFile | None:
        """Whole lines per write(2), so gateway workers can share one file (appendlog.py)."""
        if not path:
            return None
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        return AppendFile(path)

    def write(self, row: dict[str, Any]) -> None:
        row = {k: _bounded(v) for k, v in row.items()}
        if self._jsonl is not None:
            self._jsonl.write(json.dumps(row, separators=(",", ":")) + "\n")
        if self._csv is not None:
            self._csv.writerow(row)

    def flush(self) -> None:
        for f in (self._jsonl, self._csv_file):
            if f is not None:
                f.flush()

    def start(self) -> None:
        if self._jsonl is not None or self._csv_file is not None:
            self._task = asyncio.get_running_loop().create_task(self._flusher())

    async def _flusher(self) -> None:
        while True:
            await asyncio.sleep(self._flush_s)
            self.flush()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        self.flush()
        for f in (self._jsonl, self._csv_file):
            if f is not None:
                f.close()
