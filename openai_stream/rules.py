"""What a stream's events mean for timing: content-bearing deltas, the end, usage.

TTFT stops at the first *content-bearing* delta: non-empty ``content``,
``reasoning_content``, ``reasoning``, ``refusal`` or ``tool_calls`` in a chat delta, or
non-empty ``text`` in a /v1/completions choice. Role-only, empty and keep-alive chunks never
count. Providers differ in which reasoning field they stream first, which is why all of them
are listed here and nowhere else.
"""
from __future__ import annotations

from typing import Any

CONTENT_DELTA_FIELDS = ("content", "reasoning_content", "reasoning", "refusal", "tool_calls")


def choice_has_content(choice: Any) -> bool:
    """One ``choices[]`` entry: does it carry a content-bearing delta (or completion text)?"""
    if not isinstance(choice, dict):
        return False
    if choice.get("text"):  # /v1/completions
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    for name in CONTENT_DELTA_FIELDS:
        if delta.get(name):
            return True
    return False


def has_content(choices: Any) -> bool:
    """A chunk's ``choices`` list: does any choice carry content?"""
    if not choices or not isinstance(choices, list):
        return False
    for choice in choices:
        if choice_has_content(choice):
            return True
    return False


def is_done(payload: bytes | str) -> bool:
    """The stream's terminator: an event whose data is ``[DONE]``."""
    if isinstance(payload, bytes):
        return payload.strip() == b"[DONE]"
    return payload.strip() == "[DONE]"


def usage_of(obj: Any) -> tuple[int | None, int | None]:
    """(prompt_tokens, completion_tokens) from a chunk's or a response's ``usage``; None
    where absent or not an integer (a bool is not a count)."""
    usage = obj.get("usage") if isinstance(obj, dict) else None
    if not isinstance(usage, dict):
        return None, None
    prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return (prompt if type(prompt) is int else None,
            completion if type(completion) is int else None)


def finish_reason_of(choices: Any) -> str | None:
    """The last non-empty ``finish_reason`` among a chunk's choices."""
    reason = None
    for choice in choices or ():
        if isinstance(choice, dict) and choice.get("finish_reason"):
            reason = choice["finish_reason"]
    return reason
