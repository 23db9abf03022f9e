"""Keys never leak; the client's credentials and hop-by-hop headers are never forwarded."""
from __future__ import annotations

import logging

import aiohttp
import openai
import pytest

from gateway.auth import KeyStore, digest
from gateway.config import KeyConfig
from gateway.errors import Unauthorized
from tests.gateway.conftest import CLIENT_KEY, UPSTREAM_KEY, Gateway

MSG = [{"role": "user", "content": "hi"}]
WRONG_KEY = "sk-wrong-canary-41aa09"


async def test_canary_keys_appear_nowhere(make_gateway, caplog):
    caplog.set_level(logging.DEBUG)
    gw = await make_gateway(request_log_csv=None)
    client = gw.client()
    bodies: list[str] = []
    stream = await client.chat.completions.create(model="fast", messages=MSG, stream=True,
                                                  extra_body={"fake": {"ttft_ms": 0}})
    _ = [c async for c in stream]
    await client.chat.completions.create(model="fast", messages=MSG)
    for model, fake in (("fast", {"fault": "cut", "ttft_ms": 0}), ("fast", {"fault": "401"}),
                        ("fast", {"fault": "503"}), ("nope", {}), ("locked", {})):
        try:
            s = await client.chat.completions.create(model=model, messages=MSG, stream=True,
                                                     extra_body={"fake": fake})
            async for _ in s:
                pass
        except openai.APIError as exc:
            bodies.append(str(exc.body) + str(exc.message))
    with pytest.raises(openai.AuthenticationError) as exc:
        await gw.client(key=WRONG_KEY).chat.completions.create(model="fast", messages=MSG)
    bodies.append(str(exc.value.body))
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/metrics") as r:
            bodies.append(await r.text())
        async with s.get(gw.url + "/readyz") as r:
            bodies.append(await r.text())
    await gw.wait_rows(8)
    # The upstream got its own key, never the client's.
    auths = {rec.headers.get("Authorization") for rec in gw.fake.received}
    assert auths == {f"Bearer {UPSTREAM_KEY}"}
    everything = "\n".join(bodies) + gw.log_path.read_text() + caplog.text
    everything += "\n".join(repr(r.__dict__) for r in caplog.records)
    for secret in (CLIENT_KEY, UPSTREAM_KEY, WRONG_KEY):
        assert secret not in everything
    assert len(bodies) >= 7 and "gateway_requests_total" in everything


async def test_hop_by_hop_and_credentials_not_forwarded(gw: Gateway):
    headers = {"Authorization": f"Bearer {CLIENT_KEY}", "Connection": "keep-alive, X-Secret-Hop",
               "X-Secret-Hop": "1", "Proxy-Authorization": "Basic abc", "TE": "trailers",
               "Cookie": "session=1", "X-Api-Key": "other", "X-Custom-Trace": "kept",
               "Upgrade": "h2c", "Keep-Alive": "timeout=5"}
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions", headers=headers,
                          json={"model": "fast", "messages": MSG}) as r:
            assert r.status == 200
    sent = gw.fake.last("/chat/completions").headers
    for h in ("X-Secret-Hop", "Proxy-Authorization", "TE", "Cookie", "X-Api-Key", "Upgrade",
              "Keep-Alive"):
        assert h not in sent, h
    assert sent["Authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert sent["X-Custom-Trace"] == "kept"


async def test_client_cannot_choose_upstream_url(gw: Gateway):
    async with aiohttp.ClientSession() as s:
        for model in ("http://127.0.0.1:1/v1", "nokey/../fake/x", "notaprovider/x"):
            async with s.post(gw.url + "/v1/chat/completions",
                              headers={"Authorization": f"Bearer {CLIENT_KEY}"},
                              json={"model": model, "messages": MSG,
                                    "api_base": "http://127.0.0.1:1"}) as r:
                assert r.status in (404, 503), model
    # Body fields like api_base are the upstream's business, not a routing choice.
    assert gw.fake.stats.requests == 0


async def test_metrics_bearer(make_gateway, monkeypatch):
    gw = await make_gateway(metrics={"bearer_sha256": digest("metrics-token").hex()})
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/metrics") as r:
            assert r.status == 401
        async with s.get(gw.url + "/metrics",
                         headers={"Authorization": "Bearer metrics-token"}) as r:
            assert r.status == 200 and "gateway_ttft_seconds" in await r.text()


def test_keystore_sha256_and_env_keys():
    store = KeyStore.from_config(
        (KeyConfig(name="a", sha256=digest("alpha").hex(), models=("m*",)),
         KeyConfig(name="b", env="B_KEY"), KeyConfig(name="c", env="UNSET_KEY")), {"B_KEY": "beta"})
    assert store.check("alpha").name == "a" and store.check("beta").name == "b"
    assert store.check("alpha").allows("m1") and not store.check("alpha").allows("x")
    for bad in ("", None, "gamma", "alph"):
        with pytest.raises(Unauthorized):
            store.check(bad)
    assert all(len(k.digest) == 32 for k in store.keys) and len(store.keys) == 2
