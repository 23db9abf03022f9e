"""Parse and validate OpenAI request bodies into one GenerationRequest (chat or completion).

Every rejection is an OpenAI-style 400 naming the offending field; the engine's own limits
(context length, KV capacity) are checked later, once the prompt is tokenized.
"""
from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from . import json_limits
from .errors import APIError, bad_request

Kind = Literal["chat", "completion"]
_MISSING = object()
INT32_MAX = 2**31 - 1  # bound of every count and token id a request may carry
MAX_MODEL_NAME = 256
MAX_STOPS = 64


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


def _get(body: dict, name: str, types: type | tuple[type, ...], default: Any = _MISSING,
         what: str = "") -> Any:
    value = body.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is _MISSING:
            raise bad_request(f"missing required field '{name}'", param=name,
                              code="missing_required_parameter")
        return default
    # bool is an int subclass in Python; JSON true must not pass as a number.
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise bad_request(f"'{name}' must be {what or _type_name(types)}", param=name)
    if not isinstance(value, types):
        raise bad_request(f"'{name}' must be {what or _type_name(types)}, got "
                          f"{_short(value)}", param=name)
    return value


def _short(value: Any, limit: int = 80) -> str:
    """A client's value for an error message, cut short."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _get_int(body: dict, name: str, lo: int, hi: int, default: Any = _MISSING) -> Any:
    value = _get(body, name, int, default)
    if value is not None and value is not default and not lo <= value <= hi:
        raise bad_request(f"'{name}' must be in [{lo}, {hi}], got {value}", param=name,
                          code="invalid_value")
    return value


def _get_float(body: dict, name: str, lo: float, hi: float, default: float) -> float:
    value = float(_get(body, name, (int, float), default))
    if not lo <= value <= hi:
        raise bad_request(f"'{name}' must be in [{lo:g}, {hi:g}], got {value:g}", param=name,
                          code="invalid_value")
    return value


def _type_name(types: type | tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             list: "an array", dict: "an object"}
    seq = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in seq)


def _content_text(content: Any, index: int) -> str:
    """Message content as text: a string, or a list of {"type": "text"} parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{index}].content[{j}]: only text parts are "
                                  "supported", param=f"messages.{index}.content.{j}")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"messages[{index}].content must be a string or a list of text parts",
                      param=f"messages.{index}.content")


def parse_messages(body: dict) -> tuple[dict, ...]:
    messages = _get(body, "messages", list)
    if not messages:
        raise bad_request("'messages' must not be empty", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'",
                              param=f"messages.{i}")
        out.append({"role": msg["role"], "content": _content_text(msg.get("content"), i)})
    return tuple(out)


def _parse_prompt(body: dict) -> tuple[str | None, tuple[int, ...] | None]:
    prompt = _get(body, "prompt", (str, list), what="a string or an array of token ids")
    if isinstance(prompt, str):
        return prompt, None
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return prompt[0], None
    if prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return None, tuple(prompt)
    raise bad_request("'prompt' must be a string or one array of token ids; batched prompts "
                      "are not supported", param="prompt")


def _parse_stop(body: dict) -> tuple[str, ...]:
    stop = _get(body, "stop", (str, list), default=[])
    stops = [stop] if isinstance(stop, str) else stop
    if not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or an array of strings", param="stop")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"'stop' holds more than {MAX_STOPS} strings", param="stop")
    if any(s == "" for s in stops):
        raise bad_request("'stop' strings must not be empty", param="stop")
    return tuple(stops)


def _parse_int_list(body: dict, name: str) -> tuple[int, ...]:
    values = _get(body, name, list, default=[])
    for i, v in enumerate(values):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= INT32_MAX:
            raise bad_request(f"'{name}' must be an array of token ids (integers in "
                              f"[0, {INT32_MAX}])", param=f"{name}.{i}", code="invalid_value")
    return tuple(values)


def _check_unsupported(body: dict) -> None:
    n = _get(body, "n", int, default=1)
    if n != 1:
        raise bad_request(f"only n=1 is supported, got n={n}", param="n")
    for name in ("presence_penalty", "frequency_penalty"):  # accepted, not applied
        _get_float(body, name, -2.0, 2.0, default=0.0)
    if body.get("echo"):
        raise bad_request("'echo' is not supported", param="echo")
    if body.get("logprobs") not in (None, False, 0):
        raise bad_request("'logprobs' is not supported", param="logprobs")
    if body.get("tools"):
        raise bad_request("'tools' is not supported", param="tools")


def _parse_sampling(body: dict) -> dict[str, Any]:
    max_tokens = _get(body, "max_completion_tokens", int, default=None)
    if max_tokens is None:
        max_tokens = _get(body, "max_tokens", int, default=None)
        param = "max_tokens"
    else:
        param = "max_completion_tokens"
    if max_tokens is not None and max_tokens < 1:
        raise bad_request(f"'{param}' must be at least 1, got {max_tokens}", param=param)
    if max_tokens is not None and max_tokens > INT32_MAX:
        raise bad_request(f"'{param}' must be at most {INT32_MAX}, got {max_tokens}",
                          param=param, code="invalid_value")
    temperature = _get_float(body, "temperature", 0.0, 2.0, default=1.0)  # OpenAI's range
    top_p = float(_get(body, "top_p", (int, float), default=1.0))
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", param="top_p")
    # -1 is vLLM's spelling of "off"; beyond the vocabulary top_k is off as well
    top_k = _get_int(body, "top_k", -1, INT32_MAX, default=0)
    min_tokens = _get_int(body, "min_tokens", 0, INT32_MAX, default=0)
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_request(f"'min_tokens' ({min_tokens}) must not exceed max_tokens "
                          f"({max_tokens})", param="min_tokens")
    return dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                top_k=max(top_k, 0),
                seed=_get_int(body, "seed", json_limits.INT64_MIN, json_limits.INT64_MAX,
                              default=None),
                min_tokens=min_tokens, ignore_eos=_get(body, "ignore_eos", bool, default=False),
                stop=_parse_stop(body), stop_token_ids=_parse_int_list(body, "stop_token_ids"))


def parse_generation(body: dict, kind: Kind) -> GenerationRequest:
    """Validate a chat or completion body (fields follow the OpenAI API, plus vLLM extras)."""
    model = _get(body, "model", str)
    if len(model) > MAX_MODEL_NAME:
        raise bad_request(f"'model' is longer than {MAX_MODEL_NAME} characters", param="model",
                          code="invalid_value")
    _check_unsupported(body)
    messages = parse_messages(body) if kind == "chat" else None
    prompt, prompt_ids = _parse_prompt(body) if kind == "completion" else (None, None)
    stream = _get(body, "stream", bool, default=False)
    options = _get(body, "stream_options", dict, default={})
    include_usage = options.get("include_usage", False)
    if not isinstance(include_usage, bool):
        raise bad_request("'stream_options.include_usage' must be a boolean",
                          param="stream_options")
    return GenerationRequest(kind=kind, model=model, messages=messages, prompt=prompt,
                             prompt_token_ids=prompt_ids, stream=stream,
                             include_usage=include_usage, **_parse_sampling(body))
