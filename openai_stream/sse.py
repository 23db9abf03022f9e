"""Server-sent events framing (the HTML living standard's event-stream grammar), on bytes.

An event ends at a blank line; its ``data:`` lines are joined with "\\n" (one leading space
after the colon is dropped); lines starting with ":" are comments; ``event:``, ``id:`` and
``retry:`` fields carry nothing that is timed. The framer hands back each complete event's
data and, for a relay that forwards the stream, every other line unchanged, so comments
(keep-alives) and named events reach the client as the server sent them.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator

# An event (or a line) that never ends must not grow without bound.
DEFAULT_MAX_EVENT_BYTES = 1 << 20


class SSEError(ValueError):
    """The byte stream breaks the framing limits (an endless line or event)."""


class SSEFramer:
    """Bytes in, complete events out. ``feed`` may be given any split of the stream."""

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self.max_event_bytes = max_event_bytes
        self.tail = b""                  # an unfinished line
        self.data: list[bytes] = []      # data lines of the event being read
        self.size = 0                    # their bytes
        self.fields = False              # other lines of it were passed on already

    def feed(self, chunk: bytes) -> list[tuple[bytes | None, bytes]]:
        """-> [(data, b"") for each complete event | (None, raw line) to pass on]."""
        lines = (self.tail + chunk if self.tail else chunk).split(b"\n")
        self.tail = lines.pop()
        if len(self.tail) > self.max_event_bytes:
            raise SSEError(f"SSE line longer than {self.max_event_bytes} bytes")
        return self._lines(lines)

    def end(self) -> list[tuple[bytes | None, bytes]]:
        """The body ended: a last line without newline, or an event without blank line,
        still counts (a server that closes right after its last event)."""
        lines, self.tail = ([self.tail] if self.tail else []), b""
        return self._lines(lines + [b""])

    def _lines(self, lines: list[bytes]) -> list[tuple[bytes | None, bytes]]:
        out: list[tuple[bytes | None, bytes]] = []
        for line in lines:
            if line[:5] == b"data:" or line.rstrip(b"\r") == b"data":
                value = line[5:].rstrip(b"\r")
                self.data.append(value[1:] if value[:1] == b" " else value)
                self.size += len(line)
                if self.size > self.max_event_bytes:
                    raise SSEError(f"SSE event longer than {self.max_event_bytes} bytes")
            elif line.strip():  # comments / event: / id: lines pass through unchanged
                out.append((None, line.rstrip(b"\r") + b"\n"))
                self.fields = self.fields or line[:1] != b":"
            elif self.data:  # blank line: the event is complete
                out.append((b"\n".join(self.data), b""))
                self.data, self.size, self.fields = [], 0, False
            elif self.fields:  # an event without data (event: ping): end it for the client
                out.append((None, b"\n"))  # too, or its fields would attach to the next one
                self.fields = False
        return out


def iter_payloads(chunks: Iterable[bytes],
                  max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> Iterator[bytes]:
    """Every event's data in a stream given as chunks (the end of the stream included)."""
    framer = SSEFramer(max_event_bytes)
    for chunk in chunks:
        for data, _ in framer.feed(chunk):
            if data is not None:
                yield data
    for data, _ in framer.end():
        if data is not None:
            yield data
