"""Config loading: YAML, config.toml / settings.json, env expansion, unknown-key rejection."""
from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, build_config, load_config
from gateway.router import Router, provider_root

REPO = Path(__file__).resolve().parents[2]
MIN = {"providers": {"p": {"base_url": "http://127.0.0.1:1/v1"}},
       "models": {"m": {"provider": "p", "model": "x"}}}


def test_default_yaml_loads():
    cfg = load_config(REPO / "configs/gateway.yaml")
    assert cfg.listen.host == "127.0.0.1" and cfg.listen.port == 8080
    assert cfg.models["smollm2"].deployments[0].model == "smollm2-135m-instruct"
    assert cfg.providers["local"].base_url == "http://127.0.0.1:8000/v1"
    assert cfg.providers["taotoken"].passthrough and cfg.keys[0].env == "GATEWAY_API_KEY"
    assert cfg.models["cloud-ref"].deployments[0].provider == "taotoken"


def test_article_toml_and_settings_json():
    toml = load_config(REPO / "configs/config.toml", env={})
    assert toml.providers["taotoken"].api_key_env == "TAOTOKEN_API_KEY"
    assert toml.providers["taotoken"].max_retries == 3 and toml.providers["taotoken"].passthrough
    assert toml.models["cloud_ref"].deployments[0].model == "your-model-name"
    assert toml.models["local_7b"].deployments[0].provider == "local_7b"
    assert toml.providers["local_7b"].base_url == "http://127.0.0.1:8000/v1"
    assert toml.models["smollm2"].deployments[0].model == "smollm2-135m-instruct"
    js = load_config(REPO / "configs/settings.json", env={})
    assert js.providers["taotoken"].base_url == "https://taotoken.net/api"
    assert js.providers["taotoken"].api_key_env == "TAOTOKEN_API_KEY"
    assert dict(js.models["your-model-name"].defaults) == {"temperature": 0.2, "max_tokens": 256}
    assert js.keys[0].env == "GATEWAY_API_KEY"


def test_settings_json_refuses_literal_key(tmp_path):
    p = tmp_path / "settings.json"
    p.write_text('{"api_base": "https://taotoken.net/api", "api_key": "sk-literal"}')
    with pytest.raises(ConfigError, match="api_key"):
        load_config(p)
    p.write_text('{"api_base": "https://x.example.com/api", "colour": 1}')
    with pytest.raises(ConfigError, match="'colour'"):
        load_config(p)


@pytest.mark.parametrize("patch,needle", [
    ({"lisen": {}}, "'lisen'"),
    ({"providers": {"p": {"base_url": "http://a", "api_key": "sk"}}}, "providers.p.api_key"),
    ({"models": {"m": {"provider": "p", "modle": "x"}}}, "models.m.modle"),
    ({"models": {"m": [{"provider": "p", "model": "x", "weight": 2}]}},
     "models.m.deployments[0].weight"),
    ({"keys": [{"name": "k", "env": "E", "scopes": []}]}, "keys[0].scopes"),
    ({"listen": {"host": "h", "prot": 1}}, "listen.prot"),
    ({"retry": {"backoff": 1}}, "retry.backoff"),
    ({"models": {"m": {"provider": "q", "model": "x"}}}, "unknown provider 'q'"),
    ({"keys": [{"name": "k", "env": "E", "sha256": "00"}]}, "exactly one"),
    ({"listen": {"port": "eighty"}}, "listen.port"),
])
def test_rejections_name_the_key(patch, needle):
    with pytest.raises(ConfigError) as exc:
        build_config({**MIN, **patch}, env={})
    assert needle in str(exc.value)


def test_env_expansion():
    doc = {**MIN, "request_log": "${LOGDIR}/r.jsonl",
           "providers": {"p": {"base_url": "${UP:-http://127.0.0.1:9}/v1"}}}
    cfg = build_config(doc, env={"LOGDIR": "/tmp/x"})
    assert cfg.request_log == "/tmp/x/r.jsonl"
    assert cfg.providers["p"].base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(ConfigError, match="LOGDIR"):
        build_config(doc, env={})


def test_base_url_with_or_without_v1():
    assert provider_root("https://taotoken.net/api") == "https://taotoken.net/api"
    assert provider_root("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000"
    assert provider_root("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    cfg = build_config({**MIN, "providers": {"p": {"base_url": "https://taotoken.net/api",
                                                   "passthrough": True}}}, env={})
    r = Router(cfg, env={})
    assert str(r.resolve("p/any-model").deployments[0].provider.url("/v1/chat/completions")) \
        == "https://taotoken.net/api/v1/chat/completions"
    assert r.resolve("p/any-model").label == "p/*"


def test_missing_provider_key_still_starts():
    doc = {**MIN, "providers": {"p": {"base_url": "http://a", "api_key_env": "NOPE_KEY"}}}
    r = Router(build_config(doc, env={}), env={})
    assert r.providers["p"].missing_env == "NOPE_KEY" and r.providers["p"].api_key is None
