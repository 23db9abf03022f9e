"""StopMatcher: stop strings across token boundaries, held-back prefixes, truncation."""
from __future__ import annotations

import pytest

from backend.server.stops import StopMatcher


def _run(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    m = StopMatcher(stops)
    out = [m.push(p) for p in pieces]
    if not m.stopped:
        out.append(m.flush())
    return out, m.stopped


def test_no_stops_passes_text_through():
    assert _run((), ["a", "b"]) == (["a", "b", ""], False)


def test_stop_split_over_pieces_is_never_shown():
    out, stopped = _run(("END",), ["hello E", "N", "D tail"])
    assert stopped and out == ["hello ", "", ""]


def test_false_prefix_is_released_when_disproved():
    out, stopped = _run(("END",), ["E", "N", "x", "more"])
    assert not stopped and "".join(out) == "ENxmore" and out[:2] == ["", ""]


def test_earliest_of_several_stops_wins():
    out, stopped = _run(("world", "lo w"), ["hello world"])
    assert stopped and out == ["hel"]


def test_held_text_flushed_at_end():
    out, stopped = _run(("STOP",), ["abc ST"])
    assert not stopped and out == ["abc ", "ST"]


@pytest.mark.parametrize("text", ["xyzSTOP", "STOPxyz", "xSTOPy"])
def test_char_by_char_matches_whole_text(text):
    out, stopped = _run(("STOP",), list(text))
    assert stopped and "".join(out) == text[:text.index("STOP")]
