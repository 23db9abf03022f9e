"""Frozen-dataclass configs from plain dicts: unknown keys are rejected by name."""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping, TypeVar

T = TypeVar("T")


def check_keys(cls: type, data: Mapping[str, Any]) -> None:
    """Raise ValueError naming every key of ``data`` that is not a field of dataclass ``cls``."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {', '.join(unknown)}")


def dataclass_from_dict(cls: type[T], data: Mapping[str, Any]) -> T:
    """``cls(**data)`` after :func:`check_keys`."""
    check_keys(cls, data)
    return cls(**data)
