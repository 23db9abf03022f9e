"""The base of every backend schema (configs, request bodies): a frozen pydantic model that
rejects unknown keys, and its errors written as the dotted path of the bad field
(``engine.block_size``, ``messages.0.content``)."""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def dotted(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as a dotted path: ``("messages", 0, "content")`` ->
    ``messages.0.content`` (OpenAI's ``param`` spelling)."""
    return ".".join(str(part) for part in loc)


def error_text(error: Any) -> str:
    """One pydantic error as ``path: message`` (``unknown key`` for an extra field)."""
    path = dotted(tuple(error["loc"]))
    if error["type"] == "extra_forbidden":
        return f"unknown key {path!r}"
    msg = error["msg"].removeprefix("Value error, ")
    return f"{path}: {msg}" if path else msg


def describe(exc: ValidationError) -> str:
    """Every error of a validation, each naming its dotted path, on one line."""
    return "; ".join(error_text(e) for e in exc.errors())


def check_choice(name: str, value: str, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``, else a ValueError listing them."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
    return value
