"""Parse a request body as JSON that can't hurt the server: bounded nesting, no integer the
engine can't hold, no NaN/Infinity, no lone surrogates.

Python's own ``json`` accepts all of these (or fails with RecursionError / ValueError deep
inside); here each is a 400 whose ``param`` is the dotted path of the bad value
(``messages.0.content``), so the client learns which field to fix.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any

from .errors import APIError, bad_request

MAX_DEPTH = 32  # OpenAI bodies nest 5 deep (tools schemas a few more)
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1
_MAX_INT_DIGITS = 20  # longer literals can't fit int64; they never become Python ints
_TOKENS = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]')  # strings (skipped) and brackets


class _Huge:
    """An integer literal too long to be parsed (only its digit count is kept)."""

    def __init__(self, literal: str) -> None:
        self.digits = len(literal.lstrip("-"))


class _NonFinite:
    def __init__(self, literal: str) -> None:
        self.literal = literal


def _int(literal: str) -> int | _Huge:
    return int(literal) if len(literal) <= _MAX_INT_DIGITS else _Huge(literal)


def _nesting(raw: bytes) -> int:
    depth = deepest = 0
    for m in _TOKENS.finditer(raw):
        tok = m.group()
        if tok in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
        elif tok in (b"]", b"}"):
            depth -= 1
    return deepest


def loads(raw: bytes) -> Any:
    """The body as JSON values; a 400 for anything malformed or out of range."""
    # Only a body with many brackets can be deep: most requests skip the scan.
    if raw.count(b"[") + raw.count(b"{") > MAX_DEPTH and _nesting(raw) > MAX_DEPTH:
        raise bad_request(f"request body is nested more than {MAX_DEPTH} levels deep",
                          code="invalid_json")
    try:
        value = json.loads(raw, parse_int=_int, parse_constant=_NonFinite)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    check(value)
    return value


def check(value: Any) -> None:
    """Walk the parsed body (iteratively) and reject the first value out of range."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, v = stack.pop()
        if isinstance(v, dict):
            for key, item in v.items():
                if not _valid_text(key):
                    raise _bad(path, "has a key that is not valid Unicode (lone surrogate)")
                stack.append((f"{path}.{key}" if path else key, item))
        elif isinstance(v, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(v))
        elif isinstance(v, str):
            if not _valid_text(v):
                raise _bad(path, "is not valid Unicode (it holds a lone surrogate)")
        elif isinstance(v, _Huge):
            raise _bad(path, f"is an integer of {v.digits} digits; integers must fit "
                             "64 bits")
        elif isinstance(v, _NonFinite):
            raise _bad(path, f"is {v.literal}; numbers must be finite")
        elif isinstance(v, bool) or v is None:
            continue
        elif isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                raise _bad(path, f"= {v} does not fit a 64-bit integer")
        elif isinstance(v, float) and not math.isfinite(v):
            raise _bad(path, "overflows to infinity; numbers must be finite")


def _valid_text(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _bad(path: str, what: str) -> APIError:
    name = _shown(path) or "the request body"
    return bad_request(f"'{name}' {what}", param=name if path else None,
                       code="invalid_value")


def _shown(path: str, limit: int = 120) -> str:
    """A path for messages, cut short (keys come from the client and may be huge)."""
    return path if len(path) <= limit else path[:limit] + "..."
