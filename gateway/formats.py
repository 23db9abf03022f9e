"""Map the shared ``config.toml`` and the ``settings.json`` format onto the gateway's YAML shape.

The result is a plain document that :func:`gateway.config.build_config` then validates, so the
same unknown-key and env rules apply. The mapping (also in docs/GATEWAY.md):

config.toml
  ``[provider]`` (name, base_url, api_key_env, timeout_seconds, max_retries, passthrough=true)
      -> ``providers.<name>``
  ``[models]`` ``alias = "http://host/v1"`` -> provider ``<alias>`` at that URL, upstream model
      ``<alias>``; ``alias = "<provider>/<model>"`` -> that provider and model; ``alias =
      {base_url=..., model=...}`` or ``{provider=..., model=...}`` -> as written.
  ``[profiling]`` -> read by the load scripts, ignored by the gateway.
  ``[gateway]`` (optional) -> listen, keys, request_log, request_log_csv, metrics, retry,
      limits, shutdown_grace_seconds, and extra ``providers``.
settings.json
  ``api_base`` -> ``providers.<name>.base_url`` where <name> is the host's main label
      (taotoken.net -> taotoken), passthrough on; ``api_key: "${VAR}"`` -> ``api_key_env: VAR``
      (a literal key is refused); ``default_model`` -> an alias of that name on that provider;
      ``request`` -> that alias's ``defaults`` (``stream`` is left to the client);
      ``profiling`` -> ignored; ``gateway`` (optional) -> as ``[gateway]`` above.
Without ``gateway.keys`` the client key is the env var ``GATEWAY_API_KEY`` for every model.
"""
from __future__ import annotations

import json
import re
import sys
from typing import Any
from urllib.parse import urlparse

from gateway.errors import ConfigError

DEFAULT_KEYS = [{"name": "default", "env": "GATEWAY_API_KEY", "models": ["*"]}]
_ENV_ONLY = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def _gateway_section(doc: dict, where: str) -> dict[str, Any]:
    section = doc.get("gateway", {})
    if not isinstance(section, dict):
        raise ConfigError(f"{where}: expected a table/object")
    out = dict(section)
    out.setdefault("keys", DEFAULT_KEYS)
    return out


def _check_keys(doc: dict, allowed: set[str], where: str) -> None:
    for k in doc:
        if k not in allowed:
            raise ConfigError(f"{where}: unknown key {k!r} (allowed: {', '.join(sorted(allowed))})")


def from_toml(text: str) -> dict[str, Any]:
    """config.toml -> gateway document."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config.toml: invalid TOML: {exc}") from None
    _check_keys(doc, {"provider", "models", "profiling", "gateway"}, "config.toml")
    out = _gateway_section(doc, "config.toml [gateway]")
    providers: dict[str, Any] = dict(out.pop("providers", {}) or {})
    prov = dict(doc.get("provider") or {})
    if prov:
        name = str(prov.pop("name", "taotoken"))
        prov.setdefault("passthrough", True)
        providers[name] = prov
    models: dict[str, Any] = {}
    for alias, value in (doc.get("models") or {}).items():
        models[alias] = _toml_model(alias, value, providers)
    out.update(providers=providers, models=models)
    return out


def _toml_model(alias: str, value: Any, providers: dict[str, Any]) -> dict[str, Any]:
    where = f"config.toml [models].{alias}"
    if isinstance(value, dict):
        value = dict(value)
        if "base_url" in value:
            providers.setdefault(alias, {"base_url": value.pop("base_url")})
            value.setdefault("provider", alias)
        value.setdefault("model", alias)
        return value
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected a URL, '<provider>/<model>' or a table")
    if re.match(r"https?://", value):
        providers.setdefault(alias, {"base_url": value})
        return {"provider": alias, "model": alias}
    if "/" in value:
        provider, model = value.split("/", 1)
        return {"provider": provider, "model": model}
    raise ConfigError(f"{where}: {value!r} is neither a URL nor '<provider>/<model>'")


def _provider_name(api_base: str) -> str:
    host = urlparse(api_base).hostname or ""
    labels = [p for p in host.split(".") if p and not p.isdigit()]
    if len(labels) >= 2:
        return labels[-2]
    return labels[0] if labels else "upstream"


def from_settings_json(text: str) -> dict[str, Any]:
    """settings.json -> gateway document."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"settings.json: invalid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError("settings.json: expected an object")
    _check_keys(doc, {"api_base", "api_key", "default_model", "request", "profiling",
                      "gateway"}, "settings.json")
    if "api_base" not in doc:
        raise ConfigError("settings.json: missing required key 'api_base'")
    out = _gateway_section(doc, "settings.json gateway")
    name = _provider_name(str(doc["api_base"]))
    provider: dict[str, Any] = {"base_url": doc["api_base"], "passthrough": True}
    if "api_key" in doc:
        m = _ENV_ONLY.match(str(doc["api_key"]))
        if not m:
            raise ConfigError("settings.json: api_key must be \"${ENV_VAR}\"; the gateway never "
                              "reads a key from a file")
        provider["api_key_env"] = m.group(1)
    providers = dict(out.pop("providers", {}) or {})
    providers[name] = provider
    models: dict[str, Any] = {}
    if doc.get("default_model"):
        defaults = {k: v for k, v in (doc.get("request") or {}).items() if k != "stream"}
        models[str(doc["default_model"])] = {"provider": name, "model": doc["default_model"],
                                             "defaults": defaults}
    out.update(providers=providers, models=models)
    return out
