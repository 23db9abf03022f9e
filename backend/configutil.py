"""Frozen-dataclass configs from plain dicts: unknown keys are rejected by name.

Only the dataclasses of backend/weights still use this; every other backend schema is a
pydantic model on backend/schema.py's base.
"""
from __future__ import annotations

from dataclasses import fields
from typing import Any, Mapping


def check_keys(cls: type, data: Mapping[str, Any]) -> None:
    """Raise ValueError naming every key of ``data`` that is not a field of dataclass ``cls``."""
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ValueError(f"unknown {cls.__name__} keys: {', '.join(unknown)}")
