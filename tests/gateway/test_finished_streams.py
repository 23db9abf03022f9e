"""A stream the client read to ``data: [DONE]`` is a success, however fast the client hangs up
afterwards; a hang-up before [DONE] is a 499."""
from __future__ import annotations

import asyncio
import json

from yarl import URL

from benchmarks.rawhttp import exchange, request_bytes
from gateway import state
from tests.gateway.conftest import CLIENT_KEY, Gateway

AUTH = {"Authorization": f"Bearer {CLIENT_KEY}", "Content-Type": "application/json"}


def _stream_request(rid: str, **fake: object) -> bytes:
    body = {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "hi"}],
            "fake": {"ttft_ms": 0, "itl_ms": 0, "tokens": 4, **fake}}
    return request_bytes("/v1/chat/completions", json.dumps(body).encode(),
                         {**AUTH, "x-request-id": rid})


async def test_hangup_right_after_done_is_recorded_200(gw: Gateway):
    url = URL(gw.url)
    n = 200
    # tail_ms: the upstream's body end comes 50 ms after its [DONE]; the client hangs up as
    # soon as it has [DONE], i.e. inside that window.
    sem = asyncio.Semaphore(25)

    async def one(i: int) -> bytes:
        async with sem:
            r = await exchange(url.host, url.port, _stream_request(f"done-{i}", tail_ms=50),
                               abort_at=b"data: [DONE]", timeout=10)
            return r.body

    bodies = await asyncio.gather(*(one(i) for i in range(n)))
    assert all(b"data: [DONE]" in b for b in bodies)
    rows = await gw.wait_rows(n)
    wrong = [r for r in rows if r["status"] != 200 or r["ttft_s"] is None
             or r["e2e_s"] is None or r["completion_tokens"] != 4]
    assert len(rows) == n and wrong == []
    m = await gw.metrics_text()
    assert f'gateway_requests_total{{code="200",model="fast",provider="fake"}} {n}.0' in m
    assert f'gateway_ttft_seconds_count{{model="fast",provider="fake"}} {n}.0' in m
    assert f'gateway_e2e_seconds_count{{model="fast",provider="fake"}} {n}.0' in m
    assert f'gateway_completion_tokens_total{{model="fast",provider="fake"}} {4 * n}.0' in m


async def test_hangup_before_done_is_499(gw: Gateway):
    url = URL(gw.url)
    r = await exchange(url.host, url.port,
                       _stream_request("early", itl_ms=200, tokens=10), abort_at=b"t1 ")
    assert r.status == 200 and b"[DONE]" not in r.body
    (row,) = await gw.wait_rows(1)
    assert row["status"] == 499 and row["error"] == "client_disconnected"
    m = await gw.metrics_text()
    assert 'gateway_ttft_seconds_count{model="fast",provider="fake"} 0.0' in m


async def test_upstream_connection_reused_after_late_body_end(gw: Gateway):
    """The body's end arriving after [DONE] still returns the connection to the pool."""
    url = URL(gw.url)
    for i in range(3):
        r = await exchange(url.host, url.port, _stream_request(f"reuse-{i}", tail_ms=30))
        assert r.complete and b"data: [DONE]" in r.body
        await asyncio.sleep(0.1)  # the tail arrives; the connection goes back
    assert gw.app[state.POOL].counts() == (1, 1)
