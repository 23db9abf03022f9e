"""Parse and validate OpenAI request bodies into one GenerationRequest (chat or completion).

Every rejection is an OpenAI-style 400 naming the offending field; the engine's own limits
(context length, KV capacity) are checked later, once the prompt is tokenized.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from .errors import bad_request

Kind = Literal["chat", "completion"]
_MISSING = object()


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


async def read_json(request: web.Request) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 saying what is wrong with it."""
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json")
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
        raise bad_request(f"'{name}' must be {what or _type_name(types)}, got {value!r}",
                          param=name)
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
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" \
                    or not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{index}].content: only text parts are supported",
                                  param="messages")
            parts.append(part["text"])
        return "".join(parts)
    raise bad_request(f"messages[{index}].content must be a string or a list of text parts",
                      param="messages")


def parse_messages(body: dict) -> tuple[dict, ...]:
    messages = _get(body, "messages", list)
    if not messages:
        raise bad_request("'messages' must not be empty", param="messages")
    out = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a string 'role'",
                              param="messages")
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
    if any(s == "" for s in stops):
        raise bad_request("'stop' strings must not be empty", param="stop")
    return tuple(stops)


def _parse_int_list(body: dict, name: str) -> tuple[int, ...]:
    values = _get(body, name, list, default=[])
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise bad_request(f"'{name}' must be an array of integers", param=name)
    return tuple(values)


def _check_unsupported(body: dict) -> None:
    n = _get(body, "n", int, default=1)
    if n != 1:
        raise bad_request(f"only n=1 is supported, got n={n}", param="n")
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
    temperature = float(_get(body, "temperature", (int, float), default=1.0))
    if temperature < 0:
        raise bad_request(f"'temperature' must be >= 0, got {temperature}", param="temperature")
    top_p = float(_get(body, "top_p", (int, float), default=1.0))
    if not 0.0 < top_p <= 1.0:
        raise bad_request(f"'top_p' must be in (0, 1], got {top_p}", param="top_p")
    top_k = _get(body, "top_k", int, default=0)
    if top_k < 0 and top_k != -1:  # -1 is vLLM's spelling of "off"
        raise bad_request(f"'top_k' must be >= 0, got {top_k}", param="top_k")
    min_tokens = _get(body, "min_tokens", int, default=0)
    if min_tokens < 0:
        raise bad_request(f"'min_tokens' must be >= 0, got {min_tokens}", param="min_tokens")
    if max_tokens is not None and min_tokens > max_tokens:
        raise bad_request(f"'min_tokens' ({min_tokens}) must not exceed max_tokens "
                          f"({max_tokens})", param="min_tokens")
    return dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                top_k=max(top_k, 0), seed=_get(body, "seed", int, default=None),
                min_tokens=min_tokens, ignore_eos=_get(body, "ignore_eos", bool, default=False),
                stop=_parse_stop(body), stop_token_ids=_parse_int_list(body, "stop_token_ids"))


def parse_generation(body: dict, kind: Kind) -> GenerationRequest:
    """Validate a chat or completion body (fields follow the OpenAI API, plus vLLM extras)."""
    model = _get(body, "model", str)
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
