"""Stop strings matched on detokenized text, holding back any text that may begin a stop."""
from __future__ import annotations


class StopMatcher:
    """Feed text deltas; get back the text that is safe to send, and whether a stop matched.

    Text that could be the start of a stop string is held back until the next delta decides
    it, so a client never sees part of a stop string. On a match the output is truncated just
    before the stop string (OpenAI semantics: the stop string itself is not returned).
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""  # received but not yet released
        self.stopped = False

    def push(self, text: str) -> str:
        """Add a delta; return the text that can be released now."""
        if self.stopped:
            return ""
        if not self._stops:
            return text
        self._pending += text
        cut = self._earliest_stop()
        if cut is not None:
            self.stopped = True
            out, self._pending = self._pending[:cut], ""
            return out
        hold = self._held_suffix_len()
        out = self._pending[:len(self._pending) - hold]
        self._pending = self._pending[len(out):]
        return out

    def flush(self) -> str:
        """The request ended without a stop string: release what was held back."""
        out, self._pending = self._pending, ""
        return "" if self.stopped else out

    def _earliest_stop(self) -> int | None:
        # Everything released earlier could not start a stop (it was held otherwise), so a
        # match can only begin inside the pending text.
        hits = [i for i in (self._pending.find(s) for s in self._stops) if i >= 0]
        return min(hits) if hits else None

    def _held_suffix_len(self) -> int:
        """Length of the longest pending suffix that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stops:
            for k in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:k]):
                    best = k
                    break
        return best
