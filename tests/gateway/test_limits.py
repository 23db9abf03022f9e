"""Per-key limits (rpm, tpm, max_concurrent): in memory, and shared through a real Redis."""
from __future__ import annotations

import asyncio
import logging
import re

import openai
import pytest
import redis
import redis.asyncio as aioredis

from gateway.limits import STORE_RETRY_SECONDS
from benchmarks.redis_server import RedisServer
from tests.gateway.conftest import CLIENT_KEY, Gateway
from tests.gateway.test_metrics import _value

MSG = [{"role": "user", "content": "one two three"}]  # 3 prompt tokens at the fake


DAY = {"window_seconds": 86400}  # no window turns over during a test


def limited_keys(**limits: int) -> list[dict]:
    return [{"name": "limited", "env": "GW_TEST_KEY", **limits},
            {"name": "free", "env": "GW_NARROW_KEY"}]


async def _ask(gw: Gateway, key: str = CLIENT_KEY, tokens: int = 2, **fake: object) -> None:
    """One stream; returns once the gateway's handler ended (its slot and tokens are
    accounted then, which may be just after the client read the last byte)."""
    logged = len(gw.log_rows())
    stream = await gw.client(key).chat.completions.create(
        model="fast", messages=MSG, stream=True,
        extra_body={"fake": {"ttft_ms": 1, "itl_ms": 1, "tokens": tokens, **fake}})
    _ = [c async for c in stream]
    await gw.wait_rows(logged + 1)


async def _shared_released(url: str, key: str = "limited") -> None:
    """Redis heard of every ended request (the gateway tells it in a task of its own)."""
    client = aioredis.Redis.from_url(url)
    try:
        for _ in range(200):
            if not await client.zcard(f"firsttoken:rl:{key}:inflight"):
                return
            await asyncio.sleep(0.02)
    finally:
        await client.aclose()


async def test_rpm_refuses_with_429_retry_after_and_counts(make_gateway):
    gw = await make_gateway(keys=limited_keys(rpm=3), limits=DAY)
    for _ in range(3):
        await _ask(gw)
    with pytest.raises(openai.RateLimitError) as err:
        await _ask(gw)
    resp = err.value.response
    assert resp.status_code == 429
    assert 1 <= int(resp.headers["Retry-After"]) <= 86400
    body = resp.json()["error"]
    assert body["code"] == "rate_limit_exceeded" and body["type"] == "rate_limit_error"
    assert "3 requests per 86400 s" in body["message"] and set(body) >= {"param", "message"}
    await _ask(gw, "sk-narrow-key")  # another key is not affected
    text = await gw.metrics_text()
    assert _value(text, "gateway_rate_limited_total", key="limited", reason="rpm") == 1
    rows = await gw.wait_rows(5)
    assert [r["status"] for r in rows].count(429) == 1
    assert gw.fake.stats.requests == 4  # the refused request never reached the upstream


async def test_max_concurrent_frees_its_slot_when_the_stream_ends(make_gateway):
    gw = await make_gateway(keys=limited_keys(max_concurrent=1))
    slow = asyncio.create_task(_ask(gw, ttft_ms=400))
    while gw.fake.stats.open_streams < 1:
        await asyncio.sleep(0.01)
    with pytest.raises(openai.RateLimitError) as err:
        await _ask(gw)
    assert err.value.response.headers["Retry-After"] == "1"
    await slow
    await _ask(gw)  # the slot is free again
    text = await gw.metrics_text()
    assert _value(text, "gateway_rate_limited_total", key="limited",
                  reason="max_concurrent") == 1


async def test_max_concurrent_slot_is_freed_by_a_client_disconnect(make_gateway):
    gw = await make_gateway(keys=limited_keys(max_concurrent=1))
    slow = asyncio.create_task(_ask(gw, ttft_ms=5000))
    while gw.fake.stats.open_streams < 1:
        await asyncio.sleep(0.01)
    slow.cancel()
    await asyncio.gather(slow, return_exceptions=True)
    await gw.wait_rows(1)
    await _ask(gw)


async def test_tpm_counts_prompt_and_completion_tokens_from_usage(make_gateway):
    gw = await make_gateway(keys=limited_keys(tpm=12), limits=DAY)
    await _ask(gw, tokens=5)   # 3 prompt + 5 completion = 8
    await _ask(gw, tokens=5)   # admitted at 8 < 12; now 16
    with pytest.raises(openai.RateLimitError) as err:
        await _ask(gw)
    assert "12 tokens per 86400 s" in err.value.response.json()["error"]["message"]
    rows = await gw.wait_rows(3)
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in rows[:2]] == [(3, 5)] * 2


@pytest.fixture
def redis_server():
    with RedisServer() as server:
        yield server


async def test_redis_store_shares_counters_between_gateways(make_gateway, redis_server):
    limits = {"store": redis_server.url, **DAY}
    a = await make_gateway(keys=limited_keys(rpm=5), limits=limits)
    b = await make_gateway(keys=limited_keys(rpm=5), limits=limits)
    outcomes = await asyncio.gather(*(_ask(g) for g in (a, b) * 5), return_exceptions=True)
    refused = [o for o in outcomes if isinstance(o, openai.RateLimitError)]
    assert len(refused) == 5 and outcomes.count(None) == 5


async def test_redis_tpm_and_concurrency_are_shared(make_gateway, redis_server):
    limits = {"store": redis_server.url, **DAY}
    a = await make_gateway(keys=limited_keys(tpm=10, max_concurrent=1), limits=limits)
    b = await make_gateway(keys=limited_keys(tpm=10, max_concurrent=1), limits=limits)
    slow = asyncio.create_task(_ask(a, ttft_ms=400, tokens=5))
    while a.fake.stats.open_streams < 1:
        await asyncio.sleep(0.01)
    with pytest.raises(openai.RateLimitError) as err:
        await _ask(b)
    assert "in flight" in err.value.response.json()["error"]["message"]
    await slow  # 3 + 5 = 8 tokens, charged in Redis (in a task after the request ended)
    await _shared_released(redis_server.url)
    await _ask(b)  # admitted at 8 < 10, the slot is free; now 13
    await _shared_released(redis_server.url)
    with pytest.raises(openai.RateLimitError) as err:
        await _ask(a)
    assert "tokens" in err.value.response.json()["error"]["message"]


async def test_gateway_keeps_serving_on_local_limits_when_redis_goes(make_gateway,
                                                                      redis_server, caplog):
    gw = await make_gateway(keys=limited_keys(rpm=4), limits={"store": redis_server.url, **DAY})
    await _ask(gw)
    redis_server.stop()
    with caplog.at_level(logging.WARNING, logger="gateway.limits"):
        for _ in range(3):
            await _ask(gw)   # local counters: 4 admitted in this window, as in Redis
        with pytest.raises(openai.RateLimitError):
            await _ask(gw)
    assert "limits store unreachable" in caplog.text
    errors = re.search(r"^gateway_limits_store_errors_total (\S+)$", await gw.metrics_text(),
                       re.M)
    assert errors and float(errors[1]) >= 1
    redis_server.start()  # a fresh, empty Redis on the same port
    await asyncio.sleep(STORE_RETRY_SECONDS + 0.1)
    for _ in range(2):
        await _ask(gw)
    client = redis.Redis.from_url(redis_server.url)
    try:  # the admissions went to Redis again
        assert [int(client.get(k)) for k in client.keys("firsttoken:rl:limited:*:req")] == [2]
    finally:
        client.close()
