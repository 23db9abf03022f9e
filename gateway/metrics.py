"""Prometheus metrics, one CollectorRegistry per app (tests build many apps in one process).

Labels are only ``model`` (the configured alias, ``<provider>/*`` for passthrough, ``(unknown)``
when the name matched nothing) and ``provider``; the request counter adds ``code``. Client-chosen
strings therefore never create series.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.multiprocess import MultiProcessCollector

# Nothing reads the `_created` series (one per counter and histogram child), so they are not
# exported: they only add lines to every scrape. A process-wide switch in prometheus-client.
disable_created_metrics()

# 1 ms .. 60 s, dense at the low end where gateway and cache-hit latencies live.
LATENCY_BUCKETS = (0.001, 0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075,
                   0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0,
                   20.0, 30.0, 45.0, 60.0)
# The gateway's own overhead is usually well under 1 ms: finer buckets below.
OVERHEAD_BUCKETS = (0.00005, 0.0001, 0.00025, 0.0005) + LATENCY_BUCKETS
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
UNKNOWN = "(unknown)"
NO_PROVIDER = "(none)"


@dataclass
class Series:
    """The labelled children for one (model, provider): looked up once, not per token."""
    ttft: object
    tpot: object
    itl: object
    e2e: object
    overhead: object
    ttfb: object
    prompt_tokens: object
    completion_tokens: object
    in_flight: object
    retries: object
    errors: object


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        labels = ("model", "provider")
        r = self.registry

        def hist(name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
            return Histogram(name, doc, labels, buckets=buckets, registry=r)

        self.ttft = hist("gateway_ttft_seconds",
                         "Receipt to the first content-bearing delta relayed to the client.")
        self.tpot = hist("gateway_tpot_seconds",
                         "(last token - first token) / (completion_tokens - 1).")
        self.itl = hist("gateway_itl_seconds", "Gap between consecutive content chunks.")
        self.e2e = hist("gateway_e2e_seconds", "Receipt to the last byte sent to the client.")
        self.overhead = hist("gateway_overhead_seconds",
                             "Time the gateway itself adds: receipt to upstream request sent "
                             "plus per-chunk relay time.", OVERHEAD_BUCKETS)
        self.ttfb = hist("gateway_upstream_ttfb_seconds",
                         "Upstream request sent to upstream response headers received.")
        self.requests = Counter("gateway_requests", "Requests by final HTTP status code.",
                                labels + ("code",), registry=r)
        self.prompt_tokens = Counter("gateway_prompt_tokens", "Prompt tokens (from usage).",
                                     labels, registry=r)
        self.completion_tokens = Counter("gateway_completion_tokens",
                                         "Completion tokens (usage, else counted chunks).",
                                         labels, registry=r)
        # livesum: with workers (workers.py) /metrics sums the live processes' values
        self.in_flight = Gauge("gateway_in_flight_requests", "Requests being served now.",
                               labels, registry=r, multiprocess_mode="livesum")
        self.retries = Counter("gateway_upstream_retries", "Upstream attempts after the first.",
                               labels, registry=r)
        self.errors = Counter("gateway_upstream_errors",
                              "Failed upstream attempts and broken streams.", labels, registry=r)
        # Operators' view: routing decisions and ejections (routing.py), key limits (limits.py).
        # deployment is "<provider>/<model>" from the config; key is a configured key name.
        self.route_decisions = Counter("gateway_route_decisions", "Requests sent to a "
                                       "deployment, by why it was chosen.",
                                       ("model", "deployment", "reason"), registry=r)
        self.deployment_ejected = Gauge("gateway_deployment_ejected", "1 while a deployment "
                                        "is ejected for consecutive failures.",
                                        ("model", "deployment"), registry=r,
                                        multiprocess_mode="livemax")
        self.rate_limited = Counter("gateway_rate_limited", "Requests refused by a client "
                                    "key's own limits.", ("key", "reason"), registry=r)
        self.limits_store_errors = Counter("gateway_limits_store_errors", "Failed calls to the "
                                           "shared limits store (local counters decided).",
                                           registry=r)
        self._series: dict[tuple[str, str], Series] = {}
        # What /metrics shows: this registry, or with workers every worker's values
        # (prometheus-client's multiprocess mode: workers.py sets PROMETHEUS_MULTIPROC_DIR).
        self.exposition = self.registry
        if os.environ.get(MULTIPROC_ENV):
            self.exposition = CollectorRegistry()
            MultiProcessCollector(self.exposition)

    def series(self, model: str, provider: str) -> Series:
        key = (model, provider)
        s = self._series.get(key)
        if s is None:
            s = Series(*(m.labels(model, provider) for m in (
                self.ttft, self.tpot, self.itl, self.e2e, self.overhead, self.ttfb,
                self.prompt_tokens, self.completion_tokens, self.in_flight, self.retries,
                self.errors)))
            self._series[key] = s
        return s

    def count_request(self, model: str, provider: str, code: int) -> None:
        self.requests.labels(model, provider, str(code)).inc()
