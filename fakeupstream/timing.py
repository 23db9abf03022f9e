"""Exact delays and send-time stamps for the fake upstream (``fakeupstream/server.py``).

Why a timerfd: uvloop's timers have 1 ms granularity (libuv keeps loop time in ms) and
asyncio's epoll selector rounds every timeout *up* to the next millisecond, so a "100 ms" sleep
on either loop ends 0.1–1.2 ms late. A spin (``time.sleep`` or a busy loop) near the deadline
would block or burn the event loop. A Linux ``timerfd`` armed at an absolute CLOCK_MONOTONIC
deadline becomes readable at that instant (kernel hrtimer, µs precision) and wakes the loop's
epoll like any socket, on uvloop as on asyncio, without burning CPU. One fd per event loop is
re-armed to the earliest pending deadline (a heap), so 256 streams cost one fd.

All times are ``time.monotonic_ns()`` (CLOCK_MONOTONIC, which is also what
``time.perf_counter_ns()`` reads on Linux, and is shared by every process on the machine).
"""
from __future__ import annotations

import asyncio
import ctypes
import heapq
import itertools
import json
import os
import time
from typing import IO

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = 0o4000
_TFD_CLOEXEC = 0o2000000
_TFD_TIMER_ABSTIME = 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    return libc if hasattr(libc, "timerfd_create") else None


def precise_timers_available() -> bool:
    """True where a timerfd can be made (Linux); elsewhere the fake falls back to loop sleeps."""
    return _libc() is not None


class PreciseTimer:
    """``await timer.sleep_until(deadline_ns)`` wakes at the deadline, never before it.

    A wake-up from an idle CPU costs this VM 60–250 µs (kernel timer slack + the hypervisor),
    so ``sleep_until(..., finish=True)`` arms the fd ``finish_us`` early and spends the rest
    yielding to the loop (``asyncio.sleep(0)``: other streams keep running) until the deadline.
    That costs up to ``finish_us`` of CPU per call, so the fake uses it for the first content
    chunk only (the TTFT), not for every token.

    Bound to the event loop that is running when it is created; ``close()`` on that loop.
    """

    def __init__(self, finish_us: float = 300.0) -> None:
        self.finish_ns = int(finish_us * 1000)
        libc = _libc()
        if libc is None:
            raise OSError("timerfd is not available on this platform")
        self._settime = libc.timerfd_settime
        fd = libc.timerfd_create(_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        self._fd = fd
        self._loop = asyncio.get_running_loop()
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()  # tie-breaker: futures don't compare
        self._armed_ns = 0  # deadline the fd is armed for; 0 = disarmed
        self._spec = _Itimerspec()
        self._loop.add_reader(fd, self._on_fire)
        self.wakeups = 0  # fd wake-ups so far (a cost measure)

    async def sleep_until(self, deadline_ns: int, finish: bool = False, grid_ns: int = 0) -> None:
        """``grid_ns`` > 0 rounds the deadline *up* to a multiple of it: sleepers due within
        the same slot share one wake-up (many streams' tokens), at most ``grid_ns`` late."""
        if grid_ns > 0:
            deadline_ns = -(-deadline_ns // grid_ns) * grid_ns
        wake_ns = deadline_ns - self.finish_ns if finish else deadline_ns
        if wake_ns > time.monotonic_ns():
            fut: asyncio.Future[None] = self._loop.create_future()
            heapq.heappush(self._heap, (wake_ns, next(self._seq), fut))
            if not self._armed_ns or wake_ns < self._armed_ns:
                self._arm(wake_ns)
            await fut  # a cancelled sleeper leaves a done future: _on_fire skips it
        while time.monotonic_ns() < deadline_ns:  # bounded by finish_ns; only when finish
            await asyncio.sleep(0)

    def _arm(self, deadline_ns: int) -> None:
        self._spec.it_value.tv_sec, self._spec.it_value.tv_nsec = divmod(deadline_ns,
                                                                         1_000_000_000)
        if self._settime(self._fd, _TFD_TIMER_ABSTIME, ctypes.byref(self._spec), None) != 0:
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._armed_ns = deadline_ns

    def _on_fire(self) -> None:
        self.wakeups += 1
        try:
            os.read(self._fd, 8)  # expiry count; reading clears readiness
        except BlockingIOError:
            pass  # re-armed earlier before this callback ran: nothing expired yet
        now = time.monotonic_ns()
        heap = self._heap
        while heap and heap[0][0] <= now:
            fut = heapq.heappop(heap)[2]
            if not fut.done():
                fut.set_result(None)
        self._armed_ns = 0
        if heap:
            self._arm(heap[0][0])

    def close(self) -> None:
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        for _, _, fut in self._heap:
            if not fut.done():
                fut.cancel()
        self._heap.clear()


async def loop_sleep_until(deadline_ns: int) -> None:
    """The default (fast) mode: the loop's own timer, which may end up to ~1.2 ms late."""
    delay = deadline_ns - time.monotonic_ns()
    if delay > 0:
        await asyncio.sleep(delay / 1e9)


class StampLog:
    """One JSONL line per stream, written when its first content chunk is sent.

    Fields: ``request_id`` (the request's ``x-request-id``), ``recv_ns`` / ``first_sent_ns``
    (CLOCK_MONOTONIC) and the same two instants as ``*_unix_ns`` (CLOCK_REALTIME, to match a
    client that records wall-clock start times, like ``RequestRecord.t_start_unix``).
    Line-buffered so a reader sees each line at once, even if the fake is killed.
    """

    def __init__(self, path: str) -> None:
        self._f: IO[str] = open(path, "a", buffering=1, encoding="utf-8")
        # Fixed offset between the two clocks, taken once: a per-line time.time_ns() would
        # cost a syscall-free vDSO call too, but one offset keeps both fields consistent.
        self._offset_ns = time.time_ns() - time.monotonic_ns()

    def write(self, request_id: str, recv_ns: int, first_sent_ns: int) -> None:
        off = self._offset_ns
        self._f.write(json.dumps({"request_id": request_id, "recv_ns": recv_ns,
                                  "first_sent_ns": first_sent_ns,
                                  "recv_unix_ns": recv_ns + off,
                                  "first_sent_unix_ns": first_sent_ns + off}) + "\n")

    def close(self) -> None:
        self._f.close()
