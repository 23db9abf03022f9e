"""The fake upstream's request model: its config, per-request options and plan, and the
whitespace "tokenizer" it counts prompts with (see fakeupstream/server.py for the server)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from multidict import CIMultiDict


def flag(v: Any) -> bool:
    return v if isinstance(v, bool) else str(v).lower() in ("1", "true", "yes")


OPTION_TYPES: dict[str, Callable[[Any], Any]] = {
    "ttft_ms": float, "itl_ms": float, "tokens": int, "fault": str, "fail_times": int,
    "retry_after": float, "cut_after": int, "stall_s": float, "keepalive": int,
    "no_role": flag, "reasoning": int, "tool_calls": flag, "stamp": flag,
    "tail_ms": float, "echo_auth": flag,
}
FAULTS = {"", "400", "422", "401", "500", "502", "503", "429", "close", "cut", "malformed", "stall_first",
           "stall_mid", "no_usage", "hang", "step_failed"}


@dataclass(frozen=True)
class FakeConfig:
    host: str = "127.0.0.1"
    port: int = 0
    ttft_ms: float = 100.0
    itl_ms: float = 10.0
    tokens: int = 64
    model: str = "fake-model"
    record_limit: int = 1000  # bounded: benches send 100k requests
    precise_timers: bool = False  # timerfd waits: exact delays (accuracy bench)
    finish_us: float = 300.0  # precise mode: last part of the TTFT wait spent yielding
    itl_grid_ns: int = 250_000  # precise mode: later tokens' deadlines round up to this grid
    stamp: bool = False  # fake_recv_ns / fake_sent_ns on every content chunk
    stamp_log: str = ""  # JSONL path: one line per stream at its first content

    def __post_init__(self) -> None:
        if self.ttft_ms < 0 or self.itl_ms < 0 or self.tokens < 0 or self.finish_us < 0 \
                or self.itl_grid_ns < 0:
            raise ValueError("ttft_ms, itl_ms, tokens, finish_us and itl_grid_ns must be >= 0")


@dataclass
class Received:
    path: str
    headers: CIMultiDict[str]  # case-insensitive, like HTTP
    body: Any


@dataclass
class Stats:
    requests: int = 0
    open_streams: int = 0
    completed_streams: int = 0
    cancelled_streams: int = 0
    attempts_by_id: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """What to do for one request, after defaults and per-request options are merged."""
    ttft_s: float
    itl_s: float
    tokens: int
    finish_reason: str
    fault: str
    retry_after: float
    cut_after: int
    stall_s: float
    keepalive: int
    role: bool
    reasoning: int
    tool_calls: bool
    include_usage: bool
    stamp: bool
    tail_s: float = 0.0       # pause between data: [DONE] and the body's end
    echo_auth: bool = False   # error bodies quote the Authorization header, \u-escaped


def words(text: str) -> list[str]:
    return text.split()


def prompt_tokens(body: dict) -> list[str]:
    if isinstance(body.get("messages"), list):
        out: list[str] = []
        for m in body["messages"]:
            content = m.get("content") if isinstance(m, dict) else None
            if isinstance(content, str):
                out += words(content)
            elif isinstance(content, list):
                for part in content:
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        out += words(part["text"])
        return out
    prompt = body.get("prompt", "")
    if isinstance(prompt, list):
        prompt = " ".join(str(p) for p in prompt)
    return words(str(prompt))


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"
