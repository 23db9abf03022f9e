"""Routing policies per model alias, the TTFT each deployment is predicted to give, and
outlier ejection.

Policies (``models.<alias>.routing``):

- ``least_in_flight`` (default): fewest requests in flight first; ties rotate.
- ``least_ttft``: lowest predicted TTFT first (ties: fewer in flight).
- ``spillover``: the first deployment (say the local GPU) while its predicted TTFT at the
  ``ttft_percentile`` meets ``ttft_slo_ms``; otherwise the others, least in flight first.
  Deployments not chosen stay in the order for failover.

Prediction. A deployment's TTFT depends on how busy it is, so recent TTFTs are kept per
*in-flight level* (how many requests it had in flight when the request was sent): the last
``SAMPLES_PER_LEVEL`` per level, forgotten after ``SAMPLE_WINDOW_SECONDS``. The prediction for
a new request at level n is the configured percentile of level n's samples; a level without
fresh samples borrows level n - 1 (so the load on a deployment grows one level at a time while
the levels below meet the SLO), else the nearest higher level (TTFT does not fall as load
rises); with neither, ``spillover`` does not send (unknown is not within the SLO) and
``least_ttft`` uses the deployment's decayed mean TTFT (0 before the first sample, so a new
deployment gets tried). Requests still waiting for their first token count too: the
prediction is at least the age of the oldest of them (a request waiting for 2 s already has a
TTFT of 2 s or more).

Ejection (Envoy's outlier detection): ``ejection.consecutive_failures`` failed attempts in a
row (connect errors, 5xx, no headers / first token in time, streams broken after the first
byte; upstream 429s do not count) eject a deployment for ``base_seconds`` x the number of
times it was ejected (capped at ``max_seconds``; the count resets after ``max_seconds`` without
an ejection). Ejected deployments are left out of the order unless all of a route's are.
"""
from __future__ import annotations

import collections
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from gateway.config import EjectionConfig
from gateway.errors import GatewayError, RateLimited
from gateway.metrics import Metrics

log = logging.getLogger("gateway.routing")
SAMPLES_PER_LEVEL = 32
SAMPLE_WINDOW_SECONDS = 30.0
EWMA_ALPHA = 0.2
MAX_LEVEL_SEARCH = 64       # levels looked at above a level without samples

# route_reason values (request log, gateway_route_decisions_total)
SINGLE = "single"                    # the alias has one deployment
LEAST_IN_FLIGHT = "least_in_flight"
LEAST_TTFT = "least_ttft"
WITHIN_SLO = "within_slo"            # spillover: the first deployment meets the SLO
SPILLOVER = "spillover"              # spillover: it would not; sent to the next
FAILOVER = "failover"                # the chosen deployment failed, another answered
ALL_EJECTED = "all_ejected"          # every deployment ejected: tried anyway


@dataclass
class _Level:
    samples: collections.deque = field(
        default_factory=lambda: collections.deque(maxlen=SAMPLES_PER_LEVEL))
    newest: float = 0.0           # monotonic time of the newest sample
    quantile: float = 0.0         # cached percentile of samples


class DeploymentStats:
    """What routing knows about one deployment: TTFT by in-flight level, requests waiting for
    their first token, and its ejection state."""

    def __init__(self, percentile: float = 99.0,
                 ejection: EjectionConfig | None = None) -> None:
        self.percentile = percentile
        self.ejection = ejection or EjectionConfig()
        self.on_ejection: Callable[[bool], None] | None = None  # called with True / False
        self.levels: dict[int, _Level] = {}
        self.mean_ttft: float | None = None
        # (monotonic start, record) of requests without a first token yet, oldest first
        self.pending: collections.deque[tuple[float, Any]] = collections.deque()
        self.failures = 0
        self.ejected_until = 0.0
        self.ejections = 0
        self.last_ejected = 0.0

    # ---- TTFT ----------------------------------------------------------------------------
    def opened(self, record: Any, now: float) -> None:
        """A request sent here got its response headers."""
        self.failures = 0
        if record.stream:  # a JSON answer has no first token to wait for
            self.oldest_pending_age(now)  # drops the answered ones: the deque stays small
            self.pending.append((now, record))

    def observe(self, level: int, ttft_s: float, now: float) -> None:
        lv = self.levels.get(level)
        if lv is None:
            lv = self.levels[level] = _Level()
        lv.samples.append(ttft_s)
        lv.newest = now
        lv.quantile = _quantile(lv.samples, self.percentile)
        self.mean_ttft = ttft_s if self.mean_ttft is None else \
            self.mean_ttft + EWMA_ALPHA * (ttft_s - self.mean_ttft)

    def oldest_pending_age(self, now: float) -> float:
        pending = self.pending
        while pending:
            record = pending[0][1]
            if record.t_first_ns is None and not record.status:
                return now - pending[0][0]
            pending.popleft()  # got its first token, or ended
        return 0.0

    def level_estimate(self, n: int, now: float) -> float | None:
        """The percentile TTFT at in-flight level n from fresh samples, or None if unknown."""
        cutoff = now - SAMPLE_WINDOW_SECONDS
        for lvl in (n, n - 1):
            lv = self.levels.get(lvl)
            if lv is not None and lv.newest >= cutoff:
                return lv.quantile
        for lvl in range(n + 1, n + 1 + MAX_LEVEL_SEARCH):
            lv = self.levels.get(lvl)
            if lv is not None and lv.newest >= cutoff:
                return lv.quantile
        return None

    def predict(self, n: int, now: float) -> float | None:
        """Predicted TTFT (s) of a request sent now with ``n`` in flight; None if unknown."""
        est = self.level_estimate(n, now)
        if n == 0 and est is None:
            est = 0.0  # an idle deployment is always worth a try
        age = self.oldest_pending_age(now)
        return None if est is None else max(est, age)

    # ---- ejection ------------------------------------------------------------------------
    def ejected(self, now: float) -> bool:
        if not self.ejected_until:
            return False
        if self.ejected_until > now:
            return True
        self.ejected_until = 0.0  # back in the pool
        if self.on_ejection is not None:
            self.on_ejection(False)
        return False

    def failed(self, error: GatewayError | None, now: float) -> None:
        """Note a failed attempt, or (``error`` None) a stream broken after its first byte."""
        if isinstance(error, RateLimited):  # the upstream pacing us is not an outlier
            return
        self.failures += 1
        cfg = self.ejection
        if self.failures < cfg.consecutive_failures or self.ejected(now):
            return
        if now - self.last_ejected > cfg.max_seconds:
            self.ejections = 0
        self.ejections += 1
        self.failures = 0
        self.last_ejected = now
        self.ejected_until = now + min(cfg.max_seconds, cfg.base_seconds * self.ejections)
        if self.on_ejection is not None:
            self.on_ejection(True)


def _quantile(samples: Sequence[float], percentile: float) -> float:
    ordered = sorted(samples)
    rank = max(0, math.ceil(percentile / 100 * len(ordered)) - 1)
    return ordered[rank]


class RoutedDeployment(Protocol):
    in_flight: int
    stats: DeploymentStats

    @property
    def label(self) -> str: ...


@dataclass
class Decision:
    order: list        # deployments to try, in order
    reason: str        # why order[0] was chosen


def decide(policy: str, slo_s: float | None, deps: Sequence[RoutedDeployment],
           rotation: int) -> Decision:
    """Order ``deps`` for one request under ``policy``; ``rotation`` breaks ties."""
    if len(deps) == 1:
        return Decision([deps[0]], SINGLE)
    now = time.monotonic()
    healthy = [d for d in deps if not d.stats.ejected(now)]
    if not healthy:
        return Decision(_least_in_flight(list(deps), rotation), ALL_EJECTED)
    if policy == "spillover":
        first = deps[0]
        rest = _least_in_flight([d for d in healthy if d is not first], rotation)
        if first in healthy:
            predicted = first.stats.predict(first.in_flight, now)
            assert slo_s is not None  # config requires ttft_slo_ms with spillover
            if predicted is not None and predicted <= slo_s or not rest:
                return Decision([first] + rest, WITHIN_SLO)
            return Decision(rest + [first], SPILLOVER)
        return Decision(rest, SPILLOVER)
    if policy == "least_ttft":
        start = rotation % len(healthy)
        rotated = healthy[start:] + healthy[:start]
        return Decision(sorted(rotated, key=lambda d: (_ttft_score(d, now), d.in_flight)),
                        LEAST_TTFT)
    return Decision(_least_in_flight(healthy, rotation), LEAST_IN_FLIGHT)


def _least_in_flight(deps: list, rotation: int) -> list:
    if not deps:
        return deps
    start = rotation % len(deps)
    return sorted(deps[start:] + deps[:start], key=lambda d: d.in_flight)


def _ttft_score(dep: RoutedDeployment, now: float) -> float:
    est = dep.stats.predict(dep.in_flight, now)
    if est is None:
        est = max(dep.stats.mean_ttft or 0.0, dep.stats.oldest_pending_age(now))
    return est


class RoutingMetrics:
    """Counts decisions into ``gateway_route_decisions_total`` and shows ejections in
    ``gateway_deployment_ejected`` (both defined in metrics.py)."""

    def __init__(self, metrics: Metrics) -> None:
        self.decisions = metrics.route_decisions
        self.ejected = metrics.deployment_ejected
        self._children: dict[tuple[str, str, str], Any] = {}

    def decided(self, model: str, deployment: str, reason: str) -> None:
        key = (model, deployment, reason)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = self.decisions.labels(*key)
        child.inc()
