"""SSE framing on its own: events end at a blank line, multi-line data, comments, limits."""
from __future__ import annotations

import pytest

from openai_stream import SSEError, SSEFramer, iter_payloads


def test_events_join_data_lines_and_pass_other_lines():
    ev = SSEFramer()
    out = ev.feed(b': keep-alive\r\n\r\nevent: x\ndata: {"a":\ndata:  1}\n\ndata: [DO')
    # one space after "data:" is dropped, a second one is data (the spec)
    assert out == [(None, b": keep-alive\n"), (None, b"event: x\n"), (b'{"a":\n 1}', b"")]
    assert ev.feed(b"NE]\n") == []            # no blank line yet: the event is not complete
    assert ev.feed(b"\n") == [(b"[DONE]", b"")]


def test_field_only_event_is_ended_for_the_client():
    # "event: ping" with no data must not lend its type to the next event
    assert SSEFramer().feed(b"event: ping\n\ndata: x\n\n") == [
        (None, b"event: ping\n"), (None, b"\n"), (b"x", b"")]
    assert SSEFramer().feed(b": comment\n\n") == [(None, b": comment\n")]


def test_one_line_event_per_read_and_crlf():
    ev = SSEFramer()  # the common case: one one-line event per read
    assert ev.feed(b'data: {"a": 1}\n\n') == [(b'{"a": 1}', b"")]
    assert ev.feed(b'data: {"b": 2}\r\n\r\n') == [(b'{"b": 2}', b"")]
    assert ev.feed(b"data:{\"c\": 3}\n\n") == [(b'{"c": 3}', b"")]  # no space after the colon
    assert ev.feed(b"data: [DONE]\n\n") == [(b"[DONE]", b"")]


def test_bare_data_field_is_an_empty_line_of_data():
    assert SSEFramer().feed(b"data\ndata: x\n\n") == [(b"\nx", b"")]


def test_end_flushes_an_unterminated_event():
    ev = SSEFramer()
    assert ev.feed(b'data: {"x": 1}') == []
    assert ev.end() == [(b'{"x": 1}', b"")]
    assert ev.end() == []


def test_any_split_of_the_stream_gives_the_same_events():
    raw = b': hi\n\ndata: {"a":\ndata: 1}\n\nevent: e\ndata: two\n\ndata: [DONE]\n\n'
    whole = list(iter_payloads([raw]))
    assert whole == [b'{"a":\n1}', b"two", b"[DONE]"]
    for cut in range(1, len(raw)):
        assert list(iter_payloads([raw[:cut], raw[cut:]])) == whole
    assert list(iter_payloads(bytes([b]) for b in raw)) == whole


def test_refuses_an_endless_event_or_line():
    ev = SSEFramer(max_event_bytes=10_000)
    with pytest.raises(SSEError):
        for _ in range(12):
            ev.feed(b"data: " + b"x" * 1000 + b"\n")  # data lines, never a blank line
    with pytest.raises(SSEError):
        SSEFramer(max_event_bytes=10_000).feed(b"data: " + b"y" * 10_010)  # never a newline
