"""Model routing: alias -> deployments (least in-flight first), and provider passthrough."""
from __future__ import annotations

import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from yarl import URL

from gateway.config import GatewayConfig, ProviderConfig
from gateway.errors import GatewayError, NotFound
from gateway.routing import FAILOVER, Decision, DeploymentStats, RoutingMetrics, decide

log = logging.getLogger("gateway.router")


@dataclass(frozen=True)
class Provider:
    name: str
    config: ProviderConfig
    api_key: str | None = field(repr=False)   # from env only; never logged (repr=False)
    missing_env: str | None                   # set when api_key_env names an unset variable
    root: str                                 # base_url without a trailing "/v1" or "/"
    _urls: dict[str, URL] = field(default_factory=dict, repr=False, compare=False)

    def url(self, endpoint: str) -> URL:
        """``endpoint`` is the OpenAI path, e.g. ``/v1/chat/completions``; parsed once."""
        url = self._urls.get(endpoint)
        if url is None:
            url = self._urls[endpoint] = URL(self.root + endpoint)
        return url


def provider_root(base_url: str) -> str:
    """Accept base_url with or without the trailing /v1 (providers document both forms)."""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


@dataclass(eq=False)
class Deployment:
    provider: Provider
    model: str
    in_flight: int = 0   # requests now using this deployment (balancing)
    limited_until: float = 0.0  # loop time its last 429's Retry-After runs to: tried last
    stats: DeploymentStats = field(default_factory=DeploymentStats)  # routing.py

    @property
    def label(self) -> str:
        """``<provider>/<upstream model>``: the metrics label and the request log's value."""
        return f"{self.provider.name}/{self.model}"

    def failed(self, error: GatewayError) -> None:
        """An attempt here failed before the first byte (counts towards ejection)."""
        self.stats.failed(error, time.monotonic())


@dataclass(frozen=True)
class Route:
    label: str                       # metrics label: the alias, or "<provider>/*"
    deployments: tuple[Deployment, ...]
    defaults: Mapping[str, Any]
    policy: str = "least_in_flight"   # routing.py
    slo_s: float | None = None        # ttft_slo_ms / 1000


class Router:
    def __init__(self, config: GatewayConfig, env: Mapping[str, str]) -> None:
        self.providers: dict[str, Provider] = {}
        for name, pc in config.providers.items():
            key = env.get(pc.api_key_env) if pc.api_key_env else None
            missing = pc.api_key_env if pc.api_key_env and not key else None
            if missing:
                log.warning("provider %r: environment variable %s is not set; its requests "
                            "will get 503", name, missing)
            self.providers[name] = Provider(name, pc, key or None, missing,
                                            provider_root(pc.base_url))
        self.routes: dict[str, Route] = {
            alias: Route(alias, tuple(
                Deployment(self.providers[d.provider], d.model,
                           stats=DeploymentStats(m.ttft_percentile, config.ejection))
                for d in m.deployments), m.defaults, m.routing,
                None if m.ttft_slo_ms is None else m.ttft_slo_ms / 1000)
            for alias, m in config.models.items()}
        self._tiebreak = itertools.count()
        self.metrics: RoutingMetrics | None = None

    def attach_metrics(self, metrics: RoutingMetrics) -> None:
        """Route decisions and ejections show in ``metrics`` (the app's registry)."""
        self.metrics = metrics
        for route in self.routes.values():
            for dep in route.deployments:
                dep.stats.on_ejection = self._ejection_hook(route.label, dep)

    def _ejection_hook(self, alias: str, dep: Deployment) -> Callable[[bool], None]:
        gauge = self.metrics.ejected.labels(alias, dep.label) if self.metrics else None

        def changed(ejected: bool) -> None:
            if ejected:
                log.warning("model %r: deployment %s ejected for %.0fs after %d consecutive "
                            "failures", alias, dep.label,
                            dep.stats.ejected_until - time.monotonic(),
                            dep.stats.ejection.consecutive_failures)
            else:
                log.info("model %r: deployment %s is back from ejection", alias, dep.label)
            if gauge is not None:
                gauge.set(1 if ejected else 0)
        return changed

    def aliases(self) -> list[str]:
        return list(self.routes)

    def resolve(self, name: str) -> Route:
        route = self.routes.get(name)
        if route is not None:
            return route
        prefix, sep, model = name.partition("/")
        provider = self.providers.get(prefix)
        if sep and model and provider is not None and provider.config.passthrough:
            return Route(f"{prefix}/*", (Deployment(provider, model),), {})
        raise NotFound(f"The model {name!r} does not exist.", param="model")

    def decide(self, route: Route) -> Decision:
        """The deployments to try for one request under the alias's routing policy."""
        return decide(route.policy, route.slo_s, route.deployments, next(self._tiebreak))

    def opened(self, route: Route, decision: Decision, dep: Deployment, rec: Any) -> None:
        """``dep`` answered with headers: note why it serves ``rec`` (log and metrics)."""
        rec.deployment = dep.label
        rec.route_reason = decision.reason if dep is decision.order[0] else FAILOVER
        rec.route_level = dep.in_flight - 1  # the others in flight when it was sent
        if len(route.deployments) > 1:  # one deployment: nothing to choose, nothing to learn
            dep.stats.opened(rec, time.monotonic())
        if self.metrics is not None and route.label in self.routes:
            self.metrics.decided(route.label, dep.label, rec.route_reason)

    def finished(self, route: Route, dep: Deployment, rec: Any) -> None:
        """The request ``dep`` served ended: learn its TTFT, or note a broken stream."""
        if len(route.deployments) == 1:
            return
        now = time.monotonic()
        if rec.status >= 500:  # broke after the headers (a 499 is the client's doing)
            dep.stats.failed(None, now)
        elif rec.stream and rec.t_first_ns is not None and rec.t_attempt_ns is not None:
            dep.stats.observe(rec.route_level, (rec.t_first_ns - rec.t_attempt_ns) / 1e9, now)

    def order(self, route: Route) -> list[Deployment]:
        """Deployments to try, least in-flight first; ties rotate so load spreads evenly."""
        deps = route.deployments
        if len(deps) == 1:
            return [deps[0]]
        start = next(self._tiebreak) % len(deps)
        rotated = deps[start:] + deps[:start]
        return sorted(rotated, key=lambda d: d.in_flight)
