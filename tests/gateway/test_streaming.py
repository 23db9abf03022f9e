"""Streaming and non-streaming relay through the real gateway with the openai SDK as client.

Timing asserts compare what the gateway recorded with the delays the fake upstream injected:
lower bounds are exact (the gateway cannot see a token before it exists), upper bounds are
generous so a loaded 2-core machine does not flake.
"""
from __future__ import annotations

import time

import aiohttp
import pytest

from gateway.config import TRANSPORTS
from tests.gateway.conftest import CLIENT_KEY, Gateway

SLACK = 1.0  # seconds of allowed scheduling noise on top of injected delays
MSG = [{"role": "user", "content": "what is the capital of France"}]


@pytest.fixture(params=TRANSPORTS)
def transport(request: pytest.FixtureRequest) -> str:
    """Every test here runs over each upstream transport (transport.py)."""
    return request.param


async def test_chat_stream_timings_and_usage_strip(gw: Gateway):
    client = gw.client()
    fake = {"ttft_ms": 150, "itl_ms": 20, "tokens": 6}
    t0 = time.perf_counter()
    stream = await client.chat.completions.create(model="fast", messages=MSG, stream=True,
                                                  extra_body={"fake": fake})
    texts, usages, t_first = [], [], None
    async for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for c in chunk.choices:
            if c.delta.content:
                t_first = t_first or time.perf_counter() - t0
                texts.append(c.delta.content)
    assert "".join(texts) == "t0 t1 t2 t3 t4 t5 "
    assert usages == []  # the client did not ask for usage: the injected usage chunk is gone
    assert t_first is not None and t_first >= 0.15
    sent = gw.fake.last("/chat/completions")
    assert sent.body["stream_options"] == {"include_usage": True}  # injected upstream
    assert sent.body["model"] == "fake-fast" and sent.body["messages"] == MSG
    (row,) = await gw.wait_rows(1)
    assert row["status"] == 200 and row["model"] == "fast" and row["provider"] == "fake"
    assert row["upstream_model"] == "fake-fast" and row["stream"] is True
    assert 0.15 <= row["ttft_s"] < 0.15 + SLACK
    assert 0.02 <= row["tpot_s"] < 0.02 + SLACK / 5
    assert 0.02 * 0.9 <= row["itl_mean_s"] < 0.02 + SLACK / 5
    assert row["e2e_s"] >= 0.15 + 5 * 0.02 and row["e2e_s"] >= row["ttft_s"]
    assert row["completion_tokens"] == 6 and row["tokens_estimated"] is False
    assert row["prompt_tokens"] == 6 and row["finish_reason"] == "stop"
    assert row["content_chunks"] == 6 and row["key_name"] == "tester"
    assert 0 < row["overhead_s"] < row["e2e_s"] and 0 < row["overhead_ttft_s"] <= row["ttft_s"]
    assert 0 <= row["upstream_ttfb_s"] < row["ttft_s"] and row["retries"] == 0
    assert isinstance(row["t_received"], float) and abs(row["t_received"] - time.time()) < 60


async def test_client_asked_usage_is_kept(gw: Gateway):
    stream = await gw.client().chat.completions.create(
        model="fast", messages=MSG, stream=True, max_tokens=3,
        stream_options={"include_usage": True}, extra_body={"fake": {"ttft_ms": 0}})
    chunks = [c async for c in stream]
    assert chunks[-1].usage.completion_tokens == 3 and chunks[-1].choices == []
    (row,) = await gw.wait_rows(1)
    assert row["finish_reason"] == "length" and row["completion_tokens"] == 3


async def test_role_keepalive_chunks_do_not_count_for_ttft(gw: Gateway):
    fake = {"ttft_ms": 200, "itl_ms": 1, "tokens": 2, "keepalive": 3}
    stream = await gw.client().chat.completions.create(model="fast", messages=MSG, stream=True,
                                                       extra_body={"fake": fake})
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    (row,) = await gw.wait_rows(1)
    assert row["ttft_s"] >= 0.2 and row["content_chunks"] == 2


async def test_reasoning_and_tool_calls_are_content(gw: Gateway):
    client = gw.client()
    for fake in ({"reasoning": 2, "tokens": 3, "ttft_ms": 100},
                 {"tool_calls": True, "tokens": 3, "ttft_ms": 100}):
        stream = await client.chat.completions.create(model="fast", messages=MSG, stream=True,
                                                      extra_body={"fake": fake})
        _ = [c async for c in stream]
    rows = await gw.wait_rows(2)
    for row in rows:
        assert row["content_chunks"] == 3 and 0.1 <= row["ttft_s"] < 0.1 + SLACK


async def test_completions_stream_and_no_usage_estimates(gw: Gateway):
    stream = await gw.client().completions.create(
        model="fast", prompt="one two", stream=True,
        extra_body={"fake": {"fault": "no_usage", "tokens": 5, "ttft_ms": 60}})
    text = "".join([c.choices[0].text async for c in stream if c.choices])
    assert text == "t0 t1 t2 t3 t4 "
    (row,) = await gw.wait_rows(1)
    assert row["endpoint"] == "/v1/completions"
    assert row["completion_tokens"] == 5 and row["tokens_estimated"] is True
    assert row["prompt_tokens"] is None and row["ttft_s"] >= 0.06


async def test_non_stream_chat_and_completions(gw: Gateway):
    client = gw.client()
    r = await client.chat.completions.create(model="fast", messages=MSG, max_tokens=4,
                                             extra_body={"fake": {"ttft_ms": 50, "itl_ms": 10}})
    assert r.choices[0].message.content == "t0 t1 t2 t3 " and r.usage.completion_tokens == 4
    r2 = await client.completions.create(model="fast", prompt="x", max_tokens=2)
    assert r2.choices[0].text == "t0 t1 "
    rows = await gw.wait_rows(2)
    assert rows[0]["stream"] is False and rows[0]["ttft_s"] is None  # not observable
    assert rows[0]["e2e_s"] >= 0.05 + 3 * 0.01 and rows[0]["completion_tokens"] == 4
    assert "stream_options" not in gw.fake.last("/completions").body


async def test_request_id_echoed_and_forwarded(gw: Gateway):
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + "/v1/chat/completions",
                          json={"model": "fast", "messages": MSG},
                          headers={"Authorization": f"Bearer {CLIENT_KEY}",
                                   "x-request-id": "client-rid-42"}) as r:
            assert r.status == 200 and r.headers["x-request-id"] == "client-rid-42"
        async with s.post(gw.url + "/v1/chat/completions",
                          json={"model": "fast", "messages": MSG, "stream": True},
                          headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as r:
            made = r.headers["x-request-id"]
            body = await r.read()
    assert len(made) == 32 and body.endswith(b"data: [DONE]\n\n")
    ids = [rec.headers["x-request-id"] for rec in gw.fake.received]
    assert ids == ["client-rid-42", made]
    rows = await gw.wait_rows(2)
    assert [r["request_id"] for r in rows] == ids


async def test_relay_is_not_buffered(gw: Gateway):
    """Each token reaches the client about when the upstream sent it, not at the end."""
    fake = {"ttft_ms": 0, "itl_ms": 150, "tokens": 4}
    stream = await gw.client().chat.completions.create(model="fast", messages=MSG, stream=True,
                                                       extra_body={"fake": fake})
    stamps = []
    async for c in stream:
        if c.choices and c.choices[0].delta.content:
            stamps.append(time.perf_counter())
    gaps = [b - a for a, b in zip(stamps, stamps[1:])]
    assert len(gaps) == 3 and all(g >= 0.1 for g in gaps)


async def test_models_health_ready(gw: Gateway):
    models = await gw.client().models.list()
    assert sorted(m.id for m in models.data) == ["fast", "locked"]
    narrow = await gw.client(key="sk-narrow-key").models.list()
    assert [m.id for m in narrow.data] == ["fast"]
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/healthz") as r:
            assert r.status == 200
        async with s.get(gw.url + "/readyz") as r:
            ready = await r.json()
    assert ready["providers"]["nokey"]["api_key"] == "missing GW_UNSET_KEY"
    assert ready["providers"]["fake"]["api_key"] == "set"


async def test_csv_request_log(make_gateway, tmp_path):
    gw = await make_gateway(request_log_csv=str(tmp_path / "runs" / "requests.csv"))
    await gw.client().chat.completions.create(model="fast", messages=MSG)
    await gw.client().completions.create(model="fast", prompt="x", stream=True)
    await gw.wait_rows(2)
    import csv
    with open(tmp_path / "runs" / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["endpoint"] for r in rows] == ["/v1/chat/completions", "/v1/completions"]
    assert rows[1]["stream"] == "True" and float(rows[1]["ttft_s"]) > 0
    assert rows[0]["request_id"] == gw.log_rows()[0]["request_id"]
