"""Gateway configuration: frozen dataclasses built from YAML (or config.toml / settings.json).

Every mapping is checked against its dataclass: an unknown key is an error naming the key and
where it was found (``models.smollm2.modle``). ``${VAR}`` and ``${VAR:-default}`` in string
values are expanded from the environment at load time; an unset variable without a default is
an error naming it. Keys are never read from the file itself: only env var names or sha256 hex.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, get_type_hints

import yaml

from gateway import formats
from gateway.errors import ConfigError


@dataclass(frozen=True)
class ListenConfig:
    host: str = "127.0.0.1"
    port: int = 8080


@dataclass(frozen=True)
class KeyConfig:
    name: str
    env: str | None = None       # env var holding the key
    sha256: str | None = None    # hex digest of the key
    models: tuple[str, ...] = ("*",)  # glob allow-list of model names
    rpm: int | None = None              # requests per limits.window_seconds (see limits.py)
    tpm: int | None = None              # prompt + completion tokens per window
    max_concurrent: int | None = None   # requests in flight at once

    def __post_init__(self) -> None:
        for name in ("rpm", "tpm", "max_concurrent"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"keys.{self.name}.{name}: must be >= 1")
        if (self.env is None) == (self.sha256 is None):
            raise ConfigError(f"keys.{self.name}: give exactly one of 'env' or 'sha256'")
        if self.sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}", self.sha256):
            raise ConfigError(f"keys.{self.name}.sha256: not a 64-digit hex sha256 digest")


@dataclass(frozen=True)
class ProviderConfig:
    base_url: str
    api_key_env: str | None = None
    timeout_seconds: float = 120.0              # total, per attempt
    connect_timeout_seconds: float = 10.0
    first_token_timeout_seconds: float | None = None  # None: same as timeout_seconds
    max_retries: int = 2
    passthrough: bool = False                   # "<provider>/<any-model>" routes here
    transport: str = "fast"                     # "fast" (httpclient.py) | "aiohttp"

    def __post_init__(self) -> None:
        if not re.match(r"https?://", self.base_url):
            raise ConfigError(f"base_url {self.base_url!r} must start with http:// or https://")
        if self.max_retries < 0 or self.timeout_seconds <= 0 or self.connect_timeout_seconds <= 0:
            raise ConfigError("max_retries must be >= 0 and timeouts > 0")
        if self.transport not in TRANSPORTS:
            raise ConfigError(f"transport {self.transport!r}: expected one of "
                              f"{', '.join(TRANSPORTS)}")


@dataclass(frozen=True)
class DeploymentConfig:
    provider: str
    model: str


ROUTING = ("least_in_flight", "least_ttft", "spillover")
TRANSPORTS = ("fast", "aiohttp")


@dataclass(frozen=True)
class ModelConfig:
    deployments: tuple[DeploymentConfig, ...]
    defaults: Mapping[str, Any] = field(default_factory=dict)  # body fields set when absent
    routing: str = "least_in_flight"       # see routing.py
    ttft_slo_ms: float | None = None       # spillover: the first deployment's TTFT target
    ttft_percentile: float = 99.0          # ... met at this percentile of recent requests

    def __post_init__(self) -> None:
        if self.routing not in ROUTING:
            raise ConfigError(f"routing: {self.routing!r} is not one of {', '.join(ROUTING)}")
        if self.routing == "spillover" and self.ttft_slo_ms is None:
            raise ConfigError("routing: spillover needs ttft_slo_ms")
        if self.ttft_slo_ms is not None and self.ttft_slo_ms <= 0:
            raise ConfigError("ttft_slo_ms: must be > 0")
        if not 0 < self.ttft_percentile <= 100:
            raise ConfigError("ttft_percentile: must be in (0, 100]")


@dataclass(frozen=True)
class MetricsConfig:
    bearer_env: str | None = None      # /metrics needs "Authorization: Bearer <value>"
    bearer_sha256: str | None = None

    def __post_init__(self) -> None:
        if self.bearer_sha256 is not None and not re.fullmatch(r"[0-9a-fA-F]{64}",
                                                               self.bearer_sha256):
            raise ConfigError("metrics.bearer_sha256: not a 64-digit hex sha256 digest")


@dataclass(frozen=True)
class RetryConfig:
    backoff_base_seconds: float = 0.05
    backoff_max_seconds: float = 2.0
    retry_after_cap_seconds: float = 5.0  # a longer Retry-After is not waited for


@dataclass(frozen=True)
class LimitsConfig:
    max_body_bytes: int = 4 * 1024 * 1024
    store: str | None = None         # redis://host:port/db shares key limits; None: in memory
    window_seconds: float = 60.0     # the window keys[].rpm / tpm count in

    def __post_init__(self) -> None:
        if self.store is not None and not re.match(r"rediss?://", self.store):
            raise ConfigError("limits.store: expected a redis:// or rediss:// URL")
        if self.window_seconds <= 0:
            raise ConfigError("limits.window_seconds: must be > 0")


@dataclass(frozen=True)
class EjectionConfig:
    """Outlier ejection (Envoy's model): consecutive failures eject a deployment for
    base_seconds x times ejected so far (capped), then it is tried again."""
    consecutive_failures: int = 5
    base_seconds: float = 30.0
    max_seconds: float = 300.0

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.base_seconds <= 0 or self.max_seconds <= 0:
            raise ConfigError("ejection: consecutive_failures >= 1 and seconds > 0")


@dataclass(frozen=True)
class ServerConfig:
    """The gateway's own HTTP server: how long a client may take, how many may connect."""
    header_timeout_seconds: float = 10.0   # first byte of a request head -> its end
    body_timeout_seconds: float = 30.0     # reading the request body
    idle_timeout_seconds: float = 75.0     # a connection with no request in progress
    max_connections: int = 10_000          # open client connections; more get a 503

    def __post_init__(self) -> None:
        if min(self.header_timeout_seconds, self.body_timeout_seconds,
               self.idle_timeout_seconds) <= 0 or self.max_connections < 1:
            raise ConfigError("server timeouts must be > 0 and max_connections >= 1")


@dataclass(frozen=True)
class GatewayConfig:
    providers: Mapping[str, ProviderConfig]
    models: Mapping[str, ModelConfig]
    listen: ListenConfig = ListenConfig()
    keys: tuple[KeyConfig, ...] = ()
    request_log: str | None = None       # JSONL path
    request_log_csv: str | None = None   # optional CSV path, same fields
    metrics: MetricsConfig = MetricsConfig()
    retry: RetryConfig = RetryConfig()
    limits: LimitsConfig = LimitsConfig()
    server: ServerConfig = ServerConfig()
    ejection: EjectionConfig = EjectionConfig()
    shutdown_grace_seconds: float = 30.0

    def __post_init__(self) -> None:
        for alias, m in self.models.items():
            for d in m.deployments:
                if d.provider not in self.providers:
                    raise ConfigError(f"models.{alias}.provider: unknown provider {d.provider!r}"
                                      f" (known: {', '.join(sorted(self.providers))})")
        names = [k.name for k in self.keys]
        if len(set(names)) != len(names):
            raise ConfigError("keys: names must be unique")


# ---- generic builder --------------------------------------------------------------------------
_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: Any, path: str, env: Mapping[str, str]) -> Any:
    """Expand ${VAR} / ${VAR:-default} in every string of a parsed document."""
    if isinstance(value, str):
        def sub(m: re.Match) -> str:
            if m.group(1) in env:
                return env[m.group(1)]
            if m.group(2) is not None:
                return m.group(2)
            raise ConfigError(f"{path}: environment variable {m.group(1)} is not set")
        return _ENV_RE.sub(sub, value)
    if isinstance(value, dict):
        return {k: expand_env(v, f"{path}.{k}" if path else str(k), env) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, f"{path}[{i}]", env) for i, v in enumerate(value)]
    return value


def _build(cls: type, data: Any, path: str) -> Any:
    """Build dataclass ``cls`` from a mapping, rejecting unknown and missing keys by path."""
    where = path or "top level"
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = [k for k in data if k not in fields]
    if unknown:
        raise ConfigError(f"{where}: unknown key {'.'.join(filter(None, [path, unknown[0]]))!r}"
                          f" (allowed: {', '.join(fields)})")
    hints = get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        kwargs[name] = _coerce(hints[name], value, f"{path}.{name}" if path else name)
    missing = [n for n, f in fields.items() if n not in kwargs and
               f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where}: missing required key {missing[0]!r}")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def _coerce(hint: Any, value: Any, path: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path)
    if hint in (int, float) and isinstance(value, (int, float)) and not isinstance(value, bool):
        return hint(value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ConfigError(f"{path}: expected {hint.__name__}, got {value!r}")
    if str(hint).startswith("tuple[str"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{path}: expected a list of strings")
        return tuple(value)
    if "None" in str(hint) and value is not None:
        inner = float if "float" in str(hint) else int if "int" in str(hint) else str
        return _coerce(inner, value, path)
    return value


_POLICY_KEYS = ("routing", "ttft_slo_ms", "ttft_percentile")


def _model(alias: str, value: Any) -> ModelConfig:
    """``{provider, model[, defaults]}``, a list of deployments, or ``{deployments, defaults}``."""
    path = f"models.{alias}"
    if isinstance(value, list):
        value = {"deployments": value}
    if not isinstance(value, dict):
        raise ConfigError(f"{path}: expected a mapping or a list of deployments")
    value = dict(value)
    defaults = value.pop("defaults", None) or {}
    if not isinstance(defaults, dict):
        raise ConfigError(f"{path}.defaults: expected a mapping")
    policy = {k: value.pop(k) for k in _POLICY_KEYS if k in value}
    if "deployments" not in value:  # the one-deployment short form
        deployments = (_build(DeploymentConfig, value, path),)
    else:
        extra = sorted(set(value) - {"deployments"})
        if extra:
            raise ConfigError(f"{path}: unknown key '{path}.{extra[0]}'")
        deps = value["deployments"]
        if not isinstance(deps, list) or not deps:
            raise ConfigError(f"{path}.deployments: expected a non-empty list")
        deployments = tuple(_build(DeploymentConfig, d, f"{path}.deployments[{i}]")
                            for i, d in enumerate(deps))
    return _build(ModelConfig, {**policy, "deployments": deployments, "defaults": defaults},
                  path)


def build_config(doc: Any, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Build a GatewayConfig from a parsed YAML-shaped document."""
    env = os.environ if env is None else env
    doc = expand_env(doc, "", env)
    if not isinstance(doc, dict):
        raise ConfigError("top level: expected a mapping")
    doc = dict(doc)
    providers = doc.pop("providers", None)
    models = doc.pop("models", None)
    keys = doc.pop("keys", [])
    if not isinstance(providers, dict) or not providers:
        raise ConfigError("providers: expected a non-empty mapping")
    if not isinstance(models, dict):
        raise ConfigError("models: expected a mapping")
    if not isinstance(keys, list):
        raise ConfigError("keys: expected a list")
    built = {f.name for f in dataclasses.fields(GatewayConfig)}
    unknown = [k for k in doc if k not in built]
    if unknown:
        raise ConfigError(f"top level: unknown key {unknown[0]!r} (allowed: {', '.join(built)})")
    hints = get_type_hints(GatewayConfig)
    kwargs: dict[str, Any] = {k: _coerce(hints[k], v, k) for k, v in doc.items()}
    kwargs["providers"] = {n: _build(ProviderConfig, p, f"providers.{n}")
                           for n, p in providers.items()}
    kwargs["keys"] = tuple(_build(KeyConfig, k, f"keys[{i}]") for i, k in enumerate(keys))
    kwargs["models"] = {str(a): _model(str(a), v) for a, v in models.items()}
    return GatewayConfig(**kwargs)


def load_config(path: str | Path, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Load ``.yaml``/``.yml``, or the ``config.toml`` / ``settings.json`` formats (formats.py)."""
    p = Path(path)
    text = p.read_text(encoding="utf-8")
    if p.suffix in (".yaml", ".yml"):
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: invalid YAML: {exc}") from None
        return build_config(doc, env)
    if p.suffix == ".toml":
        return build_config(formats.from_toml(text), env)
    if p.suffix == ".json":
        return build_config(formats.from_settings_json(text), env)
    raise ConfigError(f"{p}: unsupported config format {p.suffix!r} (use .yaml, .toml, .json)")
