"""Model routing: alias -> deployments (least in-flight first), and provider passthrough."""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import Any, Mapping

from yarl import URL

from gateway.config import GatewayConfig, ProviderConfig
from gateway.errors import NotFound

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
    """Accept base_url with or without the trailing /v1 (the article uses both)."""
    root = base_url.rstrip("/")
    return root[:-3] if root.endswith("/v1") else root


@dataclass(eq=False)
class Deployment:
    provider: Provider
    model: str
    in_flight: int = 0   # requests now using this deployment (balancing)
    limited_until: float = 0.0  # loop time its last 429's Retry-After runs to: tried last


@dataclass(frozen=True)
class Route:
    label: str                       # metrics label: the alias, or "<provider>/*"
    deployments: tuple[Deployment, ...]
    defaults: Mapping[str, Any]


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
            alias: Route(alias, tuple(Deployment(self.providers[d.provider], d.model)
                                      for d in m.deployments), m.defaults)
            for alias, m in config.models.items()}
        self._tiebreak = itertools.count()

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

    def order(self, route: Route) -> list[Deployment]:
        """Deployments to try, least in-flight first; ties rotate so load spreads evenly."""
        deps = route.deployments
        if len(deps) == 1:
            return [deps[0]]
        start = next(self._tiebreak) % len(deps)
        rotated = deps[start:] + deps[:start]
        return sorted(rotated, key=lambda d: d.in_flight)
