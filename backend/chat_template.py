"""Chat templates: render a model's own jinja2 template the way Hugging Face does.

Templates come from model files (tokenizer_config.json, chat_template.jinja, GGUF metadata), so
they are untrusted code: they run in jinja2's immutable sandbox. The environment mirrors
transformers' (trim_blocks/lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a
`tojson` that keeps non-ASCII) so a prompt renders byte-for-byte as it would there.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class ChatTemplateMissing(ValueError):
    """The model ships no chat template, so chat messages cannot be turned into a prompt."""


class ChatTemplateError(ValueError):
    """The template rejected the messages (its own `raise_exception`) or failed to render."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # jinja's own tojson escapes HTML characters, which would change the prompt.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _SafeNamespace(jinja2.utils.Namespace):
    """`namespace()` for templates, refusing underscore names: a template could otherwise
    store attributes that reach Python internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # same trick as jinja's Namespace
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _SafeNamespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _SafeNamespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates may not set underscore attributes on a namespace: {name!r}")


class _SafeDict:
    """`dict(...)` for templates without exposing the dict type itself."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any) -> dict:
        return dict.fromkeys(*args)


def compile_template(source: str) -> jinja2.Template:
    """Compile a template (callers keep the result: Tokenizer compiles its own once)."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _SafeNamespace
    env.globals["dict"] = _SafeDict()
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc


def normalize_messages(messages: list[dict]) -> list[dict]:
    """Copy messages, joining OpenAI text content parts into one string.

    Text-only templates index `message['content']` as a string; OpenAI clients may send
    `[{"type": "text", "text": ...}, ...]`. Other part types cannot be rendered by these models.
    """
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(
                f"messages[{i}] must be an object, got {type(message).__name__}")
        message = dict(message)
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise ChatTemplateError(
                        f"messages[{i}].content: only text parts are supported, got {kind!r}")
                texts.append(str(part.get("text", "")))
            message["content"] = "".join(texts)
        out.append(message)
    return out


def render_chat_template(source: str | jinja2.Template | None, messages: list[dict], *,
                         add_generation_prompt: bool = True,
                         special_tokens: dict[str, str | None] | None = None,
                         **extra: Any) -> str:
    """Render `messages` with a template (its text, or compiled by compile_template).

    `special_tokens` (bos_token, eos_token, unk_token, pad_token) are passed as template
    variables like transformers does; `extra` (e.g. tools) too.
    """
    if not source:
        raise ChatTemplateMissing(
            "this model has no chat template; use /v1/completions with a raw prompt instead")
    template = compile_template(source) if isinstance(source, str) else source
    # transformers always defines `tools` and `documents` (None when absent); some templates
    # test `is defined`, so do the same.
    variables: dict[str, Any] = {"tools": None, "documents": None}
    variables.update({k: v for k, v in (special_tokens or {}).items() if v is not None})
    variables.update(extra)
    try:
        return template.render(messages=normalize_messages(messages),
                               add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.exceptions.TemplateError as exc:
        raise ChatTemplateError(f"chat template error: {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - the template is arbitrary code run on user data
        # e.g. `'...' + message['content']` with content null: a bad request, not a crash.
        raise ChatTemplateError(
            f"the chat template cannot render these messages: {type(exc).__name__}: {exc}"
        ) from exc
