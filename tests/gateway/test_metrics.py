"""Prometheus metrics: names, buckets, bounded labels, values that match the request log."""
from __future__ import annotations

import re

import aiohttp
import openai
import pytest

from gateway.metrics import LATENCY_BUCKETS
from tests.gateway.conftest import CLIENT_KEY, Gateway

MSG = [{"role": "user", "content": "hi"}]
NAMES = ("gateway_ttft_seconds", "gateway_tpot_seconds", "gateway_itl_seconds",
         "gateway_e2e_seconds", "gateway_overhead_seconds", "gateway_upstream_ttfb_seconds",
         "gateway_requests_total", "gateway_prompt_tokens_total",
         "gateway_completion_tokens_total", "gateway_in_flight_requests",
         "gateway_upstream_retries_total", "gateway_upstream_errors_total")


def _value(text: str, name: str, **labels: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} {labels} not in metrics")


def test_buckets_span_1ms_to_60s():
    assert LATENCY_BUCKETS[0] == 0.001 and LATENCY_BUCKETS[-1] == 60.0
    assert {0.002, 0.004, 0.006, 0.008} <= set(LATENCY_BUCKETS)


async def test_metrics_after_traffic(gw: Gateway):
    client = gw.client()
    for _ in range(2):
        s = await client.chat.completions.create(
            model="fast", messages=MSG, stream=True,
            extra_body={"fake": {"ttft_ms": 100, "itl_ms": 5, "tokens": 4}})
        _ = [c async for c in s]
    for bad in ("unknown-model-xyz", "fake/passthrough-model"):
        try:
            await client.chat.completions.create(model=bad, messages=MSG)
        except openai.NotFoundError:
            pass
    async with aiohttp.ClientSession() as sess:
        async with sess.get(gw.url + "/metrics") as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            text = await r.text()
    for name in NAMES:
        assert f"# TYPE {name.removesuffix('_total')}" in text, name
    fast = {"model": "fast", "provider": "fake"}
    assert _value(text, "gateway_requests_total", code="200", **fast) == 2
    assert _value(text, "gateway_requests_total", model="(unknown)", code="404") == 1
    assert _value(text, "gateway_requests_total", model="fake/*", code="200") == 1
    assert "unknown-model-xyz" not in text and "passthrough-model" not in text
    assert _value(text, "gateway_ttft_seconds_count", **fast) == 2
    assert _value(text, "gateway_ttft_seconds_bucket", le="0.1", **fast) == 0  # >= 100 ms
    assert _value(text, "gateway_ttft_seconds_bucket", le="5.0", **fast) == 2
    assert _value(text, "gateway_itl_seconds_count", **fast) == 6  # 3 gaps x 2 requests
    assert _value(text, "gateway_completion_tokens_total", **fast) == 8
    assert _value(text, "gateway_prompt_tokens_total", **fast) == 2
    assert _value(text, "gateway_in_flight_requests", **fast) == 0
    assert _value(text, "gateway_overhead_seconds_count", **fast) == 2
    assert 'le="0.002"' in text and 'le="60.0"' in text
    labels = set(re.findall(r"\{([^}]*)\}", text))
    # deployment: "<provider>/<model>" from the config; reason: routing.py's fixed set
    assert all(set(re.findall(r'(\w+)="', lab)) <= {"model", "provider", "code", "le",
                                                    "deployment", "reason"}
               for lab in labels)


async def test_separate_registries_per_app(make_gateway):
    a = await make_gateway()
    b = await make_gateway()
    await a.client().chat.completions.create(model="fast", messages=MSG)
    assert 'code="200"' in await a.metrics_text()
    assert 'code="200"' not in await b.metrics_text()


@pytest.mark.parametrize("path", ["/healthz", "/readyz"])
async def test_probes_need_no_key(gw: Gateway, path):
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + path, headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as r:
            assert r.status == 200
