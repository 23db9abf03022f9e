"""The content-bearing rule, the end and usage: the one definition every part times with."""
from __future__ import annotations

import pytest

from openai_stream import (CONTENT_DELTA_FIELDS, choice_has_content, finish_reason_of,
                           has_content, is_done, usage_of)


@pytest.mark.parametrize("delta", [
    {"content": "Hi"}, {"reasoning_content": "thinking"}, {"reasoning": "thinking"},
    {"refusal": "I can't"}, {"tool_calls": [{"index": 0, "function": {"name": "f"}}]},
    {"role": "assistant", "content": "Hi"},
])
def test_content_bearing_deltas(delta):
    assert choice_has_content({"index": 0, "delta": delta})
    assert has_content([{"index": 0, "delta": {}}, {"index": 1, "delta": delta}])


@pytest.mark.parametrize("choice", [
    {"index": 0, "delta": {"role": "assistant"}}, {"index": 0, "delta": {"content": ""}},
    {"index": 0, "delta": {"content": None}}, {"index": 0, "delta": {"tool_calls": []}},
    {"index": 0, "delta": {}, "finish_reason": "stop"}, {"index": 0, "text": ""},
    {"index": 0, "delta": "not an object"}, "not a choice", None,
])
def test_not_content_bearing(choice):
    assert not choice_has_content(choice)
    assert not has_content([choice])


def test_completions_text_and_odd_choices_lists():
    assert has_content([{"index": 0, "text": " Paris"}])
    assert not has_content([]) and not has_content(None) and not has_content({"text": "x"})


def test_every_listed_field_counts():
    for name in CONTENT_DELTA_FIELDS:
        assert choice_has_content({"delta": {name: "x"}}), name


def test_done_and_usage_and_finish():
    assert is_done(b"[DONE]") and is_done(" [DONE]\n") and not is_done(b'{"a": 1}')
    assert usage_of({"usage": {"prompt_tokens": 5, "completion_tokens": 2}}) == (5, 2)
    assert usage_of({"usage": None}) == (None, None) and usage_of([1]) == (None, None)
    assert usage_of({"usage": {"prompt_tokens": True, "completion_tokens": "3"}}) == (None, None)
    assert finish_reason_of([{"finish_reason": None}, {"finish_reason": "length"}]) == "length"
    assert finish_reason_of(None) is None
