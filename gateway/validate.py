"""Request bodies checked at the door: JSON that parses, nests at most ``MAX_DEPTH`` deep, holds
only int64 integers and finite floats, and only strings that are valid Unicode.

Anything else is a 400 naming the offending field, never a 500 from deeper down: Python's own
limits (recursion in ``json.loads``, the 4,300-digit int-string limit) and the strings a UTF-8
writer cannot encode (lone surrogates from ``"\\ud800"``) would otherwise surface as crashes in
the gateway, its request log, or the upstream's engine.
"""
from __future__ import annotations

import json
import math
from typing import Any, NoReturn

from gateway.errors import BadRequest

MAX_DEPTH = 64
INT64_MIN, INT64_MAX = -(2 ** 63), 2 ** 63 - 1


def _no_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def parse_body(raw: bytes) -> Any:
    """``raw`` -> the JSON value, or BadRequest (malformed, too deep, out-of-range numbers)."""
    # Cheap bound first: fewer opening brackets than the limit cannot nest too deep.
    deep = raw.count(b"[") + raw.count(b"{") > MAX_DEPTH
    try:
        obj = json.loads(raw, parse_constant=_no_constant)
    except RecursionError:
        raise _too_deep() from None
    except ValueError as exc:  # also UnicodeDecodeError and the int-digits limit
        why = "NaN and Infinity are not valid JSON" if "not valid JSON" in str(exc) else \
            "integer too long" if "digits" in str(exc) else "not valid JSON"
        raise BadRequest(f"Request body is not valid JSON ({why}).") from None
    check_values(obj, deep)
    return obj


def _too_deep() -> BadRequest:
    return BadRequest(f"Request body nests deeper than {MAX_DEPTH} levels.")


def check_values(obj: Any, deep: bool = True) -> None:
    """Walk ``obj`` (iteratively: no recursion limit to hit): depth, numbers, strings."""
    stack: list[tuple[Any, int, str | None]] = [(obj, 1, None)]
    while stack:
        value, depth, param = stack.pop()
        if isinstance(value, str):
            if not value.isascii():
                _check_text(value, param)
        elif isinstance(value, bool) or value is None:
            pass
        elif isinstance(value, int):
            if not INT64_MIN <= value <= INT64_MAX:
                raise BadRequest(f"{_where(param)} holds an integer outside the 64-bit range.",
                                 param=param)
        elif isinstance(value, float):
            if not math.isfinite(value):  # 1e999 parses to inf
                raise BadRequest(f"{_where(param)} holds a number that is not finite.",
                                 param=param)
        else:
            if deep and depth > MAX_DEPTH:
                raise _too_deep()
            if isinstance(value, dict):
                for k, v in value.items():
                    if not k.isascii():
                        _check_text(k, param)
                    stack.append((v, depth + 1, k if param is None else param))
            else:
                stack.extend((v, depth + 1, param) for v in value)


def _where(param: str | None) -> str:
    return "The request body" if param is None else f"Field {param!r}"


def _check_text(text: str, param: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise BadRequest(f"{_where(param)} holds a string that is not valid Unicode (a lone "
                         "surrogate).", param=param) from None
