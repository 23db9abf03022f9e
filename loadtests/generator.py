"""The load generator watching itself: open-loop arrival schedule, CPU and event-loop lag, and
the saturation verdict that reports print instead of silently publishing wrong numbers.

Open loop: arrivals are fixed in advance (constant or Poisson); a user takes the next arrival
slot when it is free. When every user is busy the slot's request waits, and that wait is the
record's ``queue_s`` — the time a real user arriving on schedule would have waited, which a
closed-loop test hides (coordinated omission).
"""
from __future__ import annotations

import gc
import random
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

from loadtests.stats import summarize

CPU_LIMIT_PCT = 90.0       # generator process CPU (of one core) above this = saturated
LAG_LIMIT_MS = 5.0         # event-loop lag p99 above this = timings are off by that much
RATE_SHORTFALL = 0.95      # open loop: achieved < 95% of the intended rate = falling behind


class ArrivalSchedule:
    """Intended send times (``time.perf_counter`` seconds) for this generator process.

    In distributed mode each of W workers runs rate/W; constant schedules are offset by the
    worker index so the merged stream stays evenly spaced, Poisson streams merge into Poisson.
    """

    def __init__(self, kind: str, rate: float, seed: int = 0, index: int = 0,
                 processes: int = 1) -> None:
        if kind not in ("constant", "poisson") or rate <= 0:
            raise ValueError(f"bad open-loop schedule: {kind} at {rate}/s")
        self.kind, self.rate = kind, rate / max(processes, 1)
        self._rng = random.Random(seed * 1000 + index)
        self._offset = index / max(processes, 1)
        self._origin: float | None = None
        self._k = 0
        self._t = 0.0

    def next_slot(self) -> float:
        now = time.perf_counter()
        if self._origin is None:
            self._origin = now
        if self.kind == "constant":
            slot = self._origin + (self._k + self._offset) / self.rate
        else:
            self._t += self._rng.expovariate(self.rate)
            slot = self._origin + self._t
        self._k += 1
        return slot

    @property
    def slots_issued(self) -> int:
        return self._k


@dataclass
class MonitorSamples:
    cpu_pct: list[float] = field(default_factory=list)
    lag_ms: list[float] = field(default_factory=list)
    wakeup_late_ms: list[float] = field(default_factory=list)  # open loop: slot in future, late
    gc_pause_ms: list[float] = field(default_factory=list)     # collections of >= 1 ms

    def extend(self, other: "MonitorSamples") -> None:
        self.cpu_pct += other.cpu_pct
        self.lag_ms += other.lag_ms
        self.wakeup_late_ms += other.wakeup_late_ms
        self.gc_pause_ms += other.gc_pause_ms

    def to_dict(self) -> dict:
        return {"cpu_pct": self.cpu_pct, "lag_ms": self.lag_ms,
                "wakeup_late_ms": self.wakeup_late_ms, "gc_pause_ms": self.gc_pause_ms}

    @classmethod
    def from_dict(cls, d: dict) -> "MonitorSamples":
        return cls(list(d.get("cpu_pct", [])), list(d.get("lag_ms", [])),
                   list(d.get("wakeup_late_ms", [])), list(d.get("gc_pause_ms", [])))


class GeneratorMonitor:
    """Samples this process's CPU once a second and the gevent loop's lag ten times a second."""

    def __init__(self, max_samples: int = 36_000) -> None:
        self._cpu: deque[float] = deque(maxlen=max_samples)
        self._lag: deque[float] = deque(maxlen=max_samples)
        self._late: deque[float] = deque(maxlen=max_samples)
        self._gc: deque[float] = deque(maxlen=max_samples)
        self._gc_t0: float | None = None
        self._greenlets: list = []

    def start(self) -> None:
        import gevent
        import psutil
        proc = psutil.Process()
        proc.cpu_percent(None)  # first call primes the counter

        def cpu_loop() -> None:
            while True:
                gevent.sleep(1.0)
                self._cpu.append(proc.cpu_percent(None))

        def lag_loop() -> None:
            while True:
                t = time.perf_counter()
                gevent.sleep(0.1)
                self._lag.append(max(0.0, (time.perf_counter() - t - 0.1) * 1000))

        self._greenlets = [gevent.spawn(cpu_loop), gevent.spawn(lag_loop)]
        gc.callbacks.append(self._gc_callback)

    def _gc_callback(self, phase: str, info: dict) -> None:
        """Every garbage collection stalls all greenlets; keep the long ones as evidence."""
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif self._gc_t0 is not None:
            pause_ms = (time.perf_counter() - self._gc_t0) * 1000
            self._gc_t0 = None
            if pause_ms >= 1.0:
                self._gc.append(pause_ms)

    def stop(self) -> None:
        for g in self._greenlets:
            g.kill(block=False)
        self._greenlets = []
        if self._gc_callback in gc.callbacks:
            gc.callbacks.remove(self._gc_callback)

    def note_wakeup_late(self, late_s: float) -> None:
        self._late.append(late_s * 1000)

    def drain(self) -> MonitorSamples:
        """Samples since the last drain (workers ship them to the master in batches)."""
        out = MonitorSamples(list(self._cpu), list(self._lag), list(self._late), list(self._gc))
        for q in (self._cpu, self._lag, self._late, self._gc):
            q.clear()
        return out


def verdict(samples: MonitorSamples, arrival: str, intended_rate: float,
            send_times_unix: Iterable[float]) -> dict:
    """Is the generator saturated? Returns the evidence and the reasons when it is.

    ``saturated`` (the report refuses to vouch for the numbers): generator CPU p90 above 90%,
    open-loop sends late against their slots, or the achieved rate below 95% of the intended
    one. ``timing_noise``: event-loop lag p99 above 5 ms, which bounds the timing error.
    """
    cpu, lag, late = summarize(samples.cpu_pct), summarize(samples.lag_ms), \
        summarize(samples.wakeup_late_ms)
    reasons: list[str] = []
    noise: list[str] = []
    if cpu.count and cpu.p90 > CPU_LIMIT_PCT:
        reasons.append(f"generator CPU p90 {cpu.p90:.0f}% > {CPU_LIMIT_PCT:.0f}%")
    if lag.count and lag.p99 > LAG_LIMIT_MS:
        # Not saturation by itself: on a shared machine the OS may run the generator late.
        noise.append(f"event-loop lag p99 {lag.p99:.1f} ms > {LAG_LIMIT_MS:g} ms: single "
                     "timings can be late by up to that much (a busy machine or generator)")
    if late.count and late.p99 > LAG_LIMIT_MS:
        reasons.append(f"open-loop sends late by p99 {late.p99:.1f} ms (scheduler lag)")
    achieved = None
    times = sorted(send_times_unix)
    if arrival != "closed" and len(times) > 1 and times[-1] > times[0]:
        achieved = (len(times) - 1) / (times[-1] - times[0])
        if achieved < RATE_SHORTFALL * intended_rate:
            reasons.append(f"achieved {achieved:.2f} req/s < {RATE_SHORTFALL:.0%} of intended "
                           f"{intended_rate:.2f} req/s (too few users, or the generator is "
                           "saturated)")
    return {"saturated": bool(reasons), "reasons": reasons, "timing_noise": noise,
            "cpu_pct": cpu.to_dict(), "loop_lag_ms": lag.to_dict(),
            "wakeup_late_ms": late.to_dict(), "gc_pauses_ms": summarize(samples.gc_pause_ms).to_dict(),
            "intended_rate": intended_rate or None,
            "achieved_rate": achieved}
