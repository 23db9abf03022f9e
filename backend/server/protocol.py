"""Parse and validate OpenAI request bodies into one GenerationRequest (chat or completion).

The body is parsed once (``json_limits``: depth, int64, finite numbers, valid Unicode) and
validated once against a frozen pydantic model (strict types, ``extra="forbid"``). Every
rejection is an OpenAI-style 400 whose ``param`` is the dotted path of the offending field
(``messages.0.content``); an unknown top-level field is "Unrecognized request argument
supplied", as OpenAI answers. The engine's own limits (context length, KV capacity) are
checked later, once the prompt is tokenized.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from aiohttp import web
from pydantic import (AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError,
                      ValidationInfo, field_validator, model_validator)
from pydantic_core import PydanticCustomError

from backend.schema import Schema, dotted

from . import json_limits
from .errors import APIError, bad_request

Kind = Literal["chat", "completion"]
INT32_MAX = 2**31 - 1  # bound of every count and token id a request may carry
MAX_MODEL_NAME = 256
MAX_STOPS = 64

TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]
Count = Annotated[int, Field(ge=1, le=INT32_MAX)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]  # accepted, not applied


@dataclass(frozen=True)
class GenerationRequest:
    kind: Kind
    model: str
    messages: tuple[dict, ...] | None  # chat
    prompt: str | None  # completion, text prompt
    prompt_token_ids: tuple[int, ...] | None  # completion, pre-tokenized prompt
    max_tokens: int | None  # None = endpoint default
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    min_tokens: int
    ignore_eos: bool
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    stream: bool
    include_usage: bool


class _Body(Schema):
    # JSON types as they are: no "1" for 1, no true for 1 (bool is an int in Python).
    model_config = ConfigDict(strict=True)


# Our own checks' messages: api_error() puts the field's dotted path in front.
def _must_be_off(value: Any) -> Any:
    if value:
        raise PydanticCustomError("unsupported", "is not supported")
    return value


def _must_be_one(value: int) -> int:
    if value != 1:
        raise PydanticCustomError("unsupported", "must be 1 (one result per request), got {n}",
                                  {"n": value})
    return value


Off = AfterValidator(_must_be_off)  # a feature not implemented: accepted only when off
One = Annotated[int, AfterValidator(_must_be_one)]


class TextPart(_Body):
    type: Literal["text"]
    text: str


class Message(_Body):
    """A chat message: text content only. The other keys of OpenAI's message shapes are
    accepted (the SDK sends them back in multi-turn chats) and not used."""
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    function_call: dict[str, Any] | None = None
    refusal: str | None = None
    audio: dict[str, Any] | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_as_a_part(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"type": "text", "text": value}]
        if value is not None and not isinstance(value, list):
            raise PydanticCustomError("invalid_type",
                                      "must be a string or an array of text parts")
        return value

    def as_template_input(self) -> dict[str, str]:
        return {"role": self.role, "content": "".join(p.text for p in self.content or ())}


class StreamOptions(_Body):
    include_usage: bool = False
    include_obfuscation: bool | None = None  # accepted, not used (no obfuscation padding)
    continuous_usage_stats: bool | None = None  # vLLM's; accepted, usage comes once at the end


class _Generation(_Body):
    """The fields both endpoints share: OpenAI's, plus vLLM's sampling extras."""
    model: str = Field(max_length=MAX_MODEL_NAME)
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: Count | None = None
    max_completion_tokens: Count | None = None  # wins over max_tokens when both are given
    temperature: float = Field(1.0, ge=0.0, le=2.0)  # OpenAI's range; 0 = greedy
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # -1 is vLLM's spelling of "off"; beyond the vocabulary top_k is off as well
    top_k: int = Field(0, ge=-1, le=INT32_MAX)
    seed: int | None = Field(None, ge=json_limits.INT64_MIN, le=json_limits.INT64_MAX)
    min_tokens: int = Field(0, ge=0, le=INT32_MAX)
    ignore_eos: bool = False
    stop: tuple[str, ...] = ()
    stop_token_ids: list[TokenId] = []
    n: One = 1
    logprobs: Annotated[bool | int | None, Off] = None  # bool on chat, int on completions
    # Accepted and not applied: a client's defaults must not fail the request.
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _null_is_absent(cls, data: Any) -> Any:
        # JSON null means "use the default", for every field (what OpenAI does).
        if isinstance(data, dict) and None in data.values():
            return {k: v for k, v in data.items() if v is not None}
        return data

    @field_validator("stop", mode="before")
    @classmethod
    def _stops(cls, value: Any) -> Any:
        stops = [value] if isinstance(value, str) else value
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise PydanticCustomError("invalid_type", "must be a string or an array of strings")
        if len(stops) > MAX_STOPS:
            raise PydanticCustomError("invalid_value", f"holds more than {MAX_STOPS} strings")
        if "" in stops:
            raise PydanticCustomError("invalid_value", "must not hold an empty string")
        return tuple(stops)

    @field_validator("min_tokens")
    @classmethod
    def _min_within_max(cls, value: int, info: ValidationInfo) -> int:
        limit = info.data.get("max_completion_tokens") or info.data.get("max_tokens")
        if limit is not None and value > limit:
            raise PydanticCustomError("invalid_value", "({min}) must not exceed max_tokens "
                                      "({max})", {"min": value, "max": limit})
        return value

    def _request(self, kind: Kind, **prompt: Any) -> GenerationRequest:
        options = self.stream_options
        return GenerationRequest(
            kind=kind, model=self.model, max_tokens=self.max_completion_tokens or
            self.max_tokens, temperature=self.temperature, top_p=self.top_p,
            top_k=max(self.top_k, 0), seed=self.seed, min_tokens=self.min_tokens,
            ignore_eos=self.ignore_eos, stop=self.stop,
            stop_token_ids=tuple(self.stop_token_ids), stream=self.stream,
            include_usage=options is not None and options.include_usage, **prompt)


class ChatRequest(_Generation):
    """POST /v1/chat/completions."""
    messages: list[Message] = Field(min_length=1)
    tools: Annotated[list[dict[str, Any]] | None, Off] = None
    functions: Annotated[list[dict[str, Any]] | None, Off] = None  # the older tools
    # Accepted and not used: what the openai SDK passes through when a caller sets it.
    # Without tools there is nothing to choose; the rest are OpenAI-platform settings.
    tool_choice: str | dict[str, Any] | None = None
    function_call: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    response_format: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    reasoning_effort: str | None = None
    verbosity: str | None = None
    modalities: list[str] | None = None
    audio: dict[str, Any] | None = None
    prediction: dict[str, Any] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    safety_identifier: str | None = None
    web_search_options: dict[str, Any] | None = None
    moderation: dict[str, Any] | None = None

    def to_request(self) -> GenerationRequest:
        return self._request("chat", prompt=None, prompt_token_ids=None,
                             messages=tuple(m.as_template_input() for m in self.messages))


class CompletionRequest(_Generation):
    """POST /v1/completions (the legacy endpoint): one prompt, text or token ids."""
    prompt: str | list[int]
    echo: Annotated[bool, Off] = False
    suffix: Annotated[str | None, Off] = None  # no insertion mode
    best_of: One = 1

    @field_validator("prompt", mode="before")
    @classmethod
    def _one_prompt(cls, value: Any) -> Any:
        if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str):
            return value[0]
        if isinstance(value, str) or (value and isinstance(value, list) and all(
                isinstance(t, int) and not isinstance(t, bool) for t in value)):
            return value
        raise PydanticCustomError("invalid_type", "must be a string or one array of token "
                                  "ids; batched prompts are not supported")

    def to_request(self) -> GenerationRequest:
        text = self.prompt if isinstance(self.prompt, str) else None
        ids = None if text is not None else tuple(self.prompt)
        return self._request("completion", messages=None, prompt=text, prompt_token_ids=ids)


_MODELS: dict[Kind, type[ChatRequest] | type[CompletionRequest]] = {
    "chat": ChatRequest, "completion": CompletionRequest}
_MESSAGES = TypeAdapter(Annotated[list[Message], Field(min_length=1)])
_TYPE_CODES = {"missing": "missing_required_parameter", "extra_forbidden": "unknown_parameter",
               "unsupported": "unsupported_parameter"}


def _cut(text: str, limit: int = 80) -> str:
    """Client-given text (a value, a key) for an error message, cut short."""
    return text if len(text) <= limit else text[:limit] + "..."


def api_error(exc: ValidationError, prefix: tuple[Any, ...] = ()) -> APIError:
    """The first validation error as an OpenAI 400: ``param`` is its dotted path."""
    error = exc.errors(include_url=False)[0]
    kind = error["type"]
    param = _cut(dotted(prefix + tuple(error["loc"])), 120) or None
    if kind == "missing":
        message = f"missing required field '{param}'"
    elif kind == "extra_forbidden":
        message = f"Unrecognized request argument supplied: {param}"
    elif kind in ("unsupported", "invalid_type", "invalid_value"):
        message = f"'{param}' {error['msg']}"
    else:
        message = f"Invalid '{param}': {error['msg']} (got {_cut(repr(error['input']))})"
    code = _TYPE_CODES.get(kind) or ("invalid_type" if kind.endswith("_type") else
                                     "invalid_value")
    return bad_request(message, param=param, code=code)


def parse_messages(body: dict) -> tuple[dict, ...]:
    """The ``messages`` of a body (as /tokenize takes them) ready for the chat template."""
    if body.get("messages") is None:
        raise bad_request("missing required field 'messages'", param="messages",
                          code="missing_required_parameter")
    try:
        messages = _MESSAGES.validate_python(body["messages"], strict=True)
    except ValidationError as exc:
        raise api_error(exc, ("messages",)) from None
    return tuple(m.as_template_input() for m in messages)


def parse_generation(body: dict, kind: Kind) -> GenerationRequest:
    """Validate a chat or completion body (fields follow the OpenAI API, plus vLLM extras)."""
    try:
        parsed = _MODELS[kind].model_validate(body)
    except ValidationError as exc:
        raise api_error(exc) from None
    return parsed.to_request()


async def read_body(request: web.Request, timeout_s: float | None = None) -> bytes:
    """The raw body, read within timeout_s (a client that stops sending gets a 408)."""
    try:
        return await asyncio.wait_for(request.read(), timeout_s)
    except asyncio.TimeoutError:
        raise APIError(408, f"the request body did not arrive within {timeout_s:g} s",
                       code="body_timeout") from None
    except (web.HTTPException, ConnectionError):
        raise  # 413 from the size limit (the middleware shapes it); a client gone mid-body
    except Exception as exc:  # noqa: BLE001 - e.g. a Content-Encoding the body is not in
        raise APIError(400, f"the request body could not be read ({type(exc).__name__}); "
                       "check its Content-Encoding", code="invalid_body") from None


async def read_json(request: web.Request, timeout_s: float | None = None) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    body = json_limits.loads(await read_body(request, timeout_s))
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object", code="invalid_json")
    return body
