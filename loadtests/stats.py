"""Percentiles from raw samples, always with the sample count next to them.

Every report in loadtests/ (Locust summary, sweep CSV/JSON/charts, bench_ttft rows, the accuracy
benchmark) goes through :func:`summarize`, so one definition of "p99" holds everywhere. Locust's
own statistics round response times to two significant figures; these never do.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

# Below this many samples a p99 is just "about the maximum": reports warn about it.
MIN_SAMPLES_P99 = 100

PERCENTILES = (50, 90, 95, 99)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on pre-sorted values."""
    if not sorted_values:
        return math.nan
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} outside [0, 100]")
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    frac = pos - lo
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * frac


@dataclass(frozen=True)
class Summary:
    """Distribution of one metric. ``count`` is the number of raw samples behind it."""
    count: int
    mean: float
    min: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    @property
    def p99_reliable(self) -> bool:
        return self.count >= MIN_SAMPLES_P99

    def scaled(self, factor: float) -> "Summary":
        """Same distribution in other units (e.g. seconds -> milliseconds)."""
        return Summary(self.count, *(v * factor for v in (self.mean, self.min, self.p50,
                                                          self.p90, self.p95, self.p99,
                                                          self.max)))

    def to_dict(self) -> dict:
        """JSON-safe: a missing value (no samples) is None, not NaN."""
        d = {k: (None if isinstance(v, float) and math.isnan(v) else v)
             for k, v in asdict(self).items()}
        d["p99_reliable"] = self.p99_reliable
        return d

    def fmt(self, unit: str = "ms", factor: float = 1000.0) -> str:
        """``p50 12.3 ms, p99 45.6 ms (n=250)`` with a warning mark when p99 is thin."""
        if self.count == 0:
            return "no samples (n=0)"
        s = self.scaled(factor)
        warn = "" if self.p99_reliable else " [p99 from <100 samples]"
        return (f"p50 {s.p50:.2f} {unit}, p95 {s.p95:.2f} {unit}, p99 {s.p99:.2f} {unit}"
                f" (n={self.count}){warn}")


EMPTY = Summary(0, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan)


def summarize(values: Iterable[float | None]) -> Summary:
    """Summary of the finite values; ``None`` and NaN (a missing measurement) are skipped."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return EMPTY
    return Summary(count=len(xs), mean=math.fsum(xs) / len(xs), min=xs[0],
                   p50=percentile(xs, 50), p90=percentile(xs, 90), p95=percentile(xs, 95),
                   p99=percentile(xs, 99), max=xs[-1])


def thin_p99_warning(name: str, summary: Summary) -> str | None:
    """A human warning when a p99 rests on fewer than MIN_SAMPLES_P99 samples, else None."""
    if 0 < summary.count < MIN_SAMPLES_P99:
        return (f"{name}: p99 rests on {summary.count} samples (< {MIN_SAMPLES_P99}); "
                "it is close to the maximum, not a 99th percentile")
    return None
