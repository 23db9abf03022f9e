"""The fake upstream's request model: its config, per-request options and plan, and the
whitespace "tokenizer" it counts prompts with (see fakeupstream/server.py for the server)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from collections.abc import Mapping
from typing import Any, Literal

from multidict import CIMultiDict
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


Fault = Literal["", "400", "401", "422", "429", "500", "502", "503", "close", "cut", "malformed",
                "stall_first", "stall_mid", "no_usage", "hang", "step_failed"]


class FakeOptions(BaseModel):
    """Per-request options: the body's ``"fake": {...}`` and ``x-fake-<option>`` headers (the
    body wins). Header values are strings; pydantic's lax mode casts them. ``None`` = the
    server's default (FakeConfig)."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    ttft_ms: float | None = Field(None, ge=0, allow_inf_nan=False)
    itl_ms: float | None = Field(None, ge=0, allow_inf_nan=False)
    tokens: int | None = Field(None, ge=0)
    fault: Fault = ""
    fail_times: int | None = Field(None, ge=0)
    retry_after: float = Field(1.0, ge=0, allow_inf_nan=False)
    cut_after: int = Field(2, ge=0)
    stall_s: float = Field(3600.0, ge=0, allow_inf_nan=False)
    keepalive: int = Field(0, ge=0)
    no_role: bool = False
    reasoning: int = Field(0, ge=0)
    tool_calls: bool = False
    stamp: bool | None = None
    tail_ms: float = Field(0.0, ge=0, allow_inf_nan=False)
    echo_auth: bool = False

    @field_validator("fault", mode="before")
    @classmethod
    def _status_as_text(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v  # 429 -> "429"


def parse_options(headers: Mapping[str, str], fake: Any) -> FakeOptions:
    """FakeOptions from the request; ValueError naming the option (``fake.<name>``)."""
    given: dict[str, Any] = {}
    for name in FakeOptions.model_fields:
        h = headers.get("x-fake-" + name.replace("_", "-"))
        if h is not None:
            given[name] = h
    if fake is not None and not isinstance(fake, dict):
        raise ValueError("fake: must be an object of options")
    given.update(fake or {})
    try:
        return FakeOptions.model_validate(given)
    except ValidationError as exc:
        raise ValueError("; ".join(f"fake.{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                   for e in exc.errors())) from None


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
