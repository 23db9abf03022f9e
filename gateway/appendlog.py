"""A log file that several processes append to without ever interleaving lines.

Lines are collected in memory and each flush is ONE ``write(2)`` of whole lines to a file
opened ``O_APPEND``: the kernel positions every such write at the file's end atomically and
Linux serializes writes to one regular file (the inode lock), so lines written by different
gateway workers never mix (on local filesystems; NFS gives no such promise).
"""
from __future__ import annotations

import os


class AppendFile:
    """A text-file stand-in with ``write``/``flush``/``close`` (csv.writer can write to it)."""

    def __init__(self, path: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._pending: list[str] = []

    def write(self, text: str) -> int:
        self._pending.append(text)
        return len(text)

    def flush(self) -> None:
        if not self._pending:
            return
        data = "".join(self._pending).encode("utf-8")
        self._pending.clear()
        view = memoryview(data)
        while view:  # a short write only happens on a full disk or a signal: finish it
            view = view[os.write(self._fd, view):]

    def close(self) -> None:
        if self._fd >= 0:
            self.flush()
            os.close(self._fd)
            self._fd = -1
