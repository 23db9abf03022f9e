"""Prometheus metrics of one backend app: its own registry, base units, `backend_` prefix.

Latency histograms are observed per request by the generation loop; the batch-size histogram
by the engine's step observer (engine thread; prometheus-client is thread-safe); gauges and
counters that the engine owns are read from ``engine.stats()`` at scrape time, so they can
never drift from the engine's own bookkeeping.
"""
from __future__ import annotations

from typing import Callable, Iterator

from prometheus_client import (CollectorRegistry, Counter, Histogram, disable_created_metrics,
                               generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Nothing reads the `_created` series (one per counter and histogram child), so they are not
# exported: they only add lines to every scrape. A process-wide switch in prometheus-client.
disable_created_metrics()

# Fine from 1 ms: CPU decode steps are tens of ms, GPU steps a few ms, long prompts seconds.
LATENCY_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04,
                   0.05, 0.075, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0,
                   5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 60.0, 120.0)
TPOT_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                0.06, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 512)


class _EngineStatsCollector(Collector):
    """Gauges and counters read from the engine's stats at scrape time."""

    def __init__(self, stats: Callable[[], object | None]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        if s is None:  # engine not started yet
            return
        for name, doc, value in (
                ("backend_requests_running", "Requests in the running batch", s.running),
                ("backend_requests_waiting", "Requests waiting to be scheduled", s.waiting),
                ("backend_kv_blocks_used", "KV cache blocks in use", s.kv_blocks_used),
                ("backend_kv_blocks_total", "KV cache blocks in the pool", s.kv_blocks_total)):
            yield GaugeMetricFamily(name, doc, value=value)
        for name, doc, value in (
                ("backend_preemptions", "Sequences preempted (recompute)", s.preemptions_total),
                ("backend_prompt_tokens", "Prompt tokens processed", s.prompt_tokens_total),
                ("backend_cached_prompt_tokens", "Prompt tokens served from the prefix cache "
                 "(part of backend_prompt_tokens)", s.cached_prompt_tokens_total),
                ("backend_generation_tokens", "Tokens generated",
                 s.generation_tokens_total)):
            yield CounterMetricFamily(name, doc, value=value)
        info = GaugeMetricFamily("backend_attention_kernel_info",
                                 "Attention kernel that actually ran (value is always 1)",
                                 labels=["kernel"])
        info.add_metric([s.attention_kernel or "unknown"], 1)
        yield info


class Metrics:
    """The backend's metrics; one instance (and registry) per app."""

    def __init__(self, stats: Callable[[], object | None]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)

        def hist(name: str, doc: str, buckets: tuple) -> Histogram:
            return Histogram(name, doc, buckets=buckets, registry=self.registry)

        self.ttft = hist("backend_ttft_seconds",
                         "Receipt to first content-bearing delta", LATENCY_BUCKETS)
        self.tpot = hist("backend_tpot_seconds",
                         "(last token - first token) / (completion tokens - 1)", TPOT_BUCKETS)
        self.queue = hist("backend_queue_seconds",
                          "Engine arrival to first scheduled", LATENCY_BUCKETS)
        self.prefill = hist("backend_prefill_seconds",
                            "First scheduled to prompt fully processed", LATENCY_BUCKETS)
        self.e2e = hist("backend_e2e_seconds", "Receipt to the request's end", LATENCY_BUCKETS)
        self.batch_size = hist("backend_batch_size", "Sequences per engine step",
                               BATCH_BUCKETS)
        self.eager_steps = Counter(
            "backend_eager_steps", "Engine steps that no captured CUDA graph held, run "
            "eagerly (host-bound: the GPU waits on the launches)", registry=self.registry)
        self.request_errors = Counter(
            "backend_request_errors", "Requests that ended with an error, by HTTP status and "
            "error code (also streams that failed after their headers)", ["status", "code"],
            registry=self.registry)
        self.registry.register(_EngineStatsCollector(stats))

    def observe_step(self, step: object) -> None:
        """AsyncEngine step observer (called from the engine thread)."""
        self.batch_size.observe(step.batch_size)
        if step.graphed is False:
            self.eager_steps.inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
