"""Gateway configuration: frozen pydantic models built from YAML (or config.toml / settings.json).

Every mapping is checked against its model (``extra="forbid"``): an unknown key is an error
naming the key and where it was found (``models.smollm2.modle``). ``${VAR}`` and
``${VAR:-default}`` in string values are expanded from the environment at load time; an unset
variable without a default is an error naming it. Keys are never read from the file itself:
only env var names or sha256 hex.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Literal, Mapping, get_args

import yaml
from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator,
                      model_validator)

from gateway import formats
from gateway.errors import ConfigError

_SHA256 = re.compile(r"[0-9a-fA-F]{64}")

Transport = Literal["fast", "aiohttp"]  # httpclient.py | aiohttp (honours proxy variables)
TRANSPORTS: tuple[str, ...] = get_args(Transport)


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ListenConfig(_Schema):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)


class KeyConfig(_Schema):
    name: str
    env: str | None = None       # env var holding the key
    sha256: str | None = None    # hex digest of the key
    models: tuple[str, ...] = ("*",)  # glob allow-list of model names
    rpm: int | None = Field(None, ge=1)             # requests per limits.window_seconds
    tpm: int | None = Field(None, ge=1)             # prompt + completion tokens per window
    max_concurrent: int | None = Field(None, ge=1)  # requests in flight at once

    @model_validator(mode="after")
    def _one_source(self) -> "KeyConfig":
        if (self.env is None) == (self.sha256 is None):
            raise ValueError(f"keys.{self.name}: give exactly one of 'env' or 'sha256'")
        if self.sha256 is not None and not _SHA256.fullmatch(self.sha256):
            raise ValueError(f"keys.{self.name}.sha256: not a 64-digit hex sha256 digest")
        return self


class ProviderConfig(_Schema):
    base_url: str
    api_key_env: str | None = None
    timeout_seconds: float = Field(120.0, gt=0)     # total, per attempt
    connect_timeout_seconds: float = Field(10.0, gt=0)
    first_token_timeout_seconds: float | None = Field(None, gt=0)  # None: timeout_seconds
    max_retries: int = Field(2, ge=0)
    passthrough: bool = False                       # "<provider>/<any-model>" routes here
    transport: Transport = "fast"
    health_path: str | None = Field(None, pattern=r"^/")  # GET root+path answers 2xx when up

    @field_validator("base_url")
    @classmethod
    def _http(cls, v: str) -> str:
        if not re.match(r"https?://", v):
            raise ValueError(f"{v!r} must start with http:// or https://")
        return v


class DeploymentConfig(_Schema):
    provider: str
    model: str


class ModelConfig(_Schema):
    deployments: tuple[DeploymentConfig, ...] = Field(min_length=1)
    defaults: dict[str, Any] = Field(default_factory=dict)  # body fields set when absent
    routing: Literal["least_in_flight", "least_ttft", "spillover"] = "least_in_flight"
    ttft_slo_ms: float | None = Field(None, gt=0)  # spillover: the first deployment's target
    ttft_percentile: float = Field(99.0, gt=0, le=100)  # ... met at this percentile

    @model_validator(mode="after")
    def _spillover_has_a_target(self) -> "ModelConfig":
        if self.routing == "spillover" and self.ttft_slo_ms is None:
            raise ValueError("routing: spillover needs ttft_slo_ms")
        return self


class MetricsConfig(_Schema):
    bearer_env: str | None = None      # /metrics needs "Authorization: Bearer <value>"
    bearer_sha256: str | None = None

    @field_validator("bearer_sha256")
    @classmethod
    def _digest(cls, v: str | None) -> str | None:
        if v is not None and not _SHA256.fullmatch(v):
            raise ValueError("not a 64-digit hex sha256 digest")
        return v


class RetryConfig(_Schema):
    backoff_base_seconds: float = Field(0.05, ge=0)
    backoff_max_seconds: float = Field(2.0, ge=0)
    retry_after_cap_seconds: float = Field(5.0, ge=0)  # accepted; no longer used


class LimitsConfig(_Schema):
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1)
    store: str | None = None  # redis://host:port/db shares key limits; None: in memory
    window_seconds: float = Field(60.0, gt=0)  # the window keys[].rpm / tpm count in

    @field_validator("store")
    @classmethod
    def _redis(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"rediss?://", v):
            raise ValueError("expected a redis:// or rediss:// URL")
        return v


class EjectionConfig(_Schema):
    """Outlier ejection (Envoy's model): consecutive failures eject a deployment for
    base_seconds x times ejected so far (capped), then it is tried again."""
    consecutive_failures: int = Field(5, ge=1)
    base_seconds: float = Field(30.0, gt=0)
    max_seconds: float = Field(300.0, gt=0)


class ServerConfig(_Schema):
    """The gateway's own HTTP server: how long a client may take, how many may connect."""
    header_timeout_seconds: float = Field(10.0, gt=0)  # first byte of a request head -> end
    body_timeout_seconds: float = Field(30.0, gt=0)    # reading the request body
    idle_timeout_seconds: float = Field(75.0, gt=0)    # a connection with no request
    max_connections: int = Field(10_000, ge=1)         # open client connections; more: 503


class GatewayConfig(_Schema):
    providers: dict[str, ProviderConfig] = Field(min_length=1)
    models: dict[str, ModelConfig]
    listen: ListenConfig = ListenConfig()
    keys: tuple[KeyConfig, ...] = ()
    request_log: str | None = None       # JSONL path
    request_log_csv: str | None = None   # optional CSV path, same fields
    metrics: MetricsConfig = MetricsConfig()
    retry: RetryConfig = RetryConfig()
    limits: LimitsConfig = LimitsConfig()
    server: ServerConfig = ServerConfig()
    ejection: EjectionConfig = EjectionConfig()
    shutdown_grace_seconds: float = Field(30.0, ge=0)

    @model_validator(mode="after")
    def _references(self) -> "GatewayConfig":
        for alias, m in self.models.items():
            for d in m.deployments:
                if d.provider not in self.providers:
                    raise ValueError(f"models.{alias}.provider: unknown provider "
                                     f"{d.provider!r} (known: {', '.join(sorted(self.providers))})")
        names = [k.name for k in self.keys]
        if len(set(names)) != len(names):
            raise ValueError("keys: names must be unique")
        return self


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


_POLICY_KEYS = ("routing", "ttft_slo_ms", "ttft_percentile", "defaults")


def _long_form(value: Any) -> Any:
    """The short forms of ``models.<alias>``: ``{provider, model[, defaults, routing...]}``
    (one deployment) or a list of deployments, written as ``{deployments: [...], ...}``."""
    if isinstance(value, list):
        return {"deployments": value}
    if isinstance(value, dict) and "deployments" not in value:
        single = {k: v for k, v in value.items() if k not in _POLICY_KEYS}
        return {**{k: v for k, v in value.items() if k in _POLICY_KEYS},
                "deployments": [single]}
    return value


def _where(loc: tuple[Any, ...], short: set[str]) -> str:
    """A pydantic error location as the dotted path of the file (``keys[0].env``); inside a
    one-deployment short form the made-up ``deployments[0]`` is left out."""
    if len(loc) >= 4 and loc[0] == "models" and loc[1] in short and loc[2:4] == ("deployments", 0):
        loc = loc[:2] + loc[4:]
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(exc: ValidationError, short: set[str]) -> str:
    errors = exc.errors()
    failed = [tuple(e["loc"]) for e in errors]
    lines = []
    for e in errors:
        loc = tuple(e["loc"])
        if e["type"] == "too_short" and any(f[:len(loc)] == loc and f != loc for f in failed):
            continue  # a list whose bad items were dropped: the items' errors say it all
        path = _where(loc, short)
        if e["type"] == "extra_forbidden":
            parent = path.rpartition(".")[0] if "." in path else "top level"
            lines.append(f"{parent}: unknown key {path!r}")
        else:
            msg = e["msg"].removeprefix("Value error, ")
            lines.append(msg if e["type"] == "value_error" and not path
                         else f"{path or 'top level'}: {msg}")
    return "; ".join(lines)


def build_config(doc: Any, env: Mapping[str, str] | None = None) -> GatewayConfig:
    """Build a GatewayConfig from a parsed YAML-shaped document."""
    env = os.environ if env is None else env
    doc = expand_env(doc, "", env)
    short: set[str] = set()
    if isinstance(doc, dict) and isinstance(doc.get("models"), dict):
        models = {}
        for alias, value in doc["models"].items():
            if isinstance(value, dict) and "deployments" not in value:
                short.add(str(alias))
            models[str(alias)] = _long_form(value)
        doc = {**doc, "models": models}
    try:
        return GatewayConfig.model_validate(doc)
    except ValidationError as exc:
        raise ConfigError(_message(exc, short)) from None


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
