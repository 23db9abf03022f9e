"""SLO-aware routing (least_ttft, spillover), outlier ejection, and what the log and metrics say
about each decision: real gateways in front of fake upstreams with different TTFTs."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from gateway.routing import SPILLOVER, WITHIN_SLO, DeploymentStats, decide
from fakeupstream import FakeConfig, FakeUpstream
from loadtests.procs import free_port
from tests.gateway.conftest import Gateway
from tests.gateway.test_metrics import _value

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture
async def slow_and_fast():
    async with FakeUpstream(FakeConfig(ttft_ms=250, itl_ms=1, tokens=3)) as slow, \
            FakeUpstream(FakeConfig(ttft_ms=5, itl_ms=1, tokens=3)) as fast:
        yield slow, fast


def two(slow: FakeUpstream, fast: FakeUpstream, **policy: object) -> dict:
    return {"providers": {"local": {"base_url": slow.base_url, "max_retries": 0},
                          "cloud": {"base_url": fast.base_url, "max_retries": 0}},
            "models": {"pool": {"deployments": [{"provider": "local", "model": "l"},
                                                {"provider": "cloud", "model": "c"}],
                                **policy}}}


async def _ask(gw: Gateway, n: int = 1) -> None:
    """``n`` streams one after another, each returning once the gateway's handler ended (it
    learns the TTFT then, which may be just after the client read the last byte)."""
    for _ in range(n):
        logged = len(gw.log_rows())
        stream = await gw.client().chat.completions.create(model="pool", messages=MSG,
                                                           stream=True)
        _ = [c async for c in stream]
        await gw.wait_rows(logged + 1)


async def test_spillover_keeps_the_first_deployment_while_it_meets_the_slo(make_gateway,
                                                                           slow_and_fast):
    slow, fast = slow_and_fast
    gw = await make_gateway(**two(fast, slow, routing="spillover", ttft_slo_ms=100))
    await _ask(gw, 6)  # "local" is the fast one here: 5 ms < 100 ms, it takes everything
    rows = await gw.wait_rows(6)
    assert {(r["deployment"], r["route_reason"]) for r in rows} == {("local/l", WITHIN_SLO)}


async def test_spillover_sends_the_rest_on_once_the_first_breaks_the_slo(make_gateway,
                                                                         slow_and_fast):
    slow, fast = slow_and_fast
    gw = await make_gateway(**two(slow, fast, routing="spillover", ttft_slo_ms=100))
    await _ask(gw, 5)
    rows = await gw.wait_rows(5)
    # The first request explores the idle local deployment (250 ms > 100 ms): then spill.
    assert [(r["deployment"], r["route_reason"]) for r in rows] == \
        [("local/l", WITHIN_SLO)] + [("cloud/c", SPILLOVER)] * 4
    assert all(r["ttft_s"] < 0.1 for r in rows[1:])
    text = await gw.metrics_text()
    assert _value(text, "gateway_route_decisions_total", model="pool", deployment="cloud/c",
                  reason="spillover") == 4


def test_spillover_counts_requests_still_waiting_for_their_first_token():
    stats = DeploymentStats(99.0)
    local = SimpleNamespace(in_flight=1, stats=stats, label="local/l")
    cloud = SimpleNamespace(in_flight=0, stats=DeploymentStats(99.0), label="cloud/c")
    stats.observe(0, 0.010, time.monotonic())
    waiting = SimpleNamespace(stream=True, t_first_ns=None, status=0)
    stats.opened(waiting, time.monotonic() - 0.5)  # waiting for 0.5 s
    assert decide("spillover", 0.1, [local, cloud], 0).reason == SPILLOVER
    waiting.t_first_ns = 1  # its first token came: level 0's 10 ms stands
    local.in_flight = 0
    assert decide("spillover", 0.1, [local, cloud], 0).reason == WITHIN_SLO


async def test_least_ttft_prefers_the_lower_recent_ttft(make_gateway, slow_and_fast):
    slow, fast = slow_and_fast
    gw = await make_gateway(**two(slow, fast, routing="least_ttft"))
    await _ask(gw, 8)
    rows = await gw.wait_rows(8)
    assert {r["route_reason"] for r in rows} == {"least_ttft"}
    assert [r["deployment"] for r in rows].count("local/l") <= 1  # tried once at most
    assert all(r["deployment"] == "cloud/c" for r in rows[-5:])


async def test_consecutive_failures_eject_a_deployment(make_gateway, fake):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens: connection refused
    gw = await make_gateway(
        providers={"dead": {"base_url": dead, "max_retries": 1}},
        models={"pool": [{"provider": "dead", "model": "d"}, {"provider": "fake", "model": "f"}]},
        ejection={"consecutive_failures": 2, "base_seconds": 30})
    await _ask(gw, 8)
    rows = await gw.wait_rows(8)
    assert all(r["status"] == 200 and r["deployment"] == "fake/f" for r in rows)
    assert sum(r["retries"] for r in rows) == 2  # two failed attempts, then no more
    assert rows[-1]["route_reason"] == "least_in_flight" and rows[-1]["retries"] == 0
    text = await gw.metrics_text()
    assert _value(text, "gateway_deployment_ejected", model="pool", deployment="dead/d") == 1
    assert _value(text, "gateway_deployment_ejected", model="pool", deployment="fake/f") == 0


async def test_an_ejected_deployment_comes_back_after_its_backoff(make_gateway, fake):
    gw = await make_gateway(models={"pool": [{"provider": "fake", "model": "a"},
                                             {"provider": "fake", "model": "b"}]},
                            ejection={"consecutive_failures": 1, "base_seconds": 0.3})
    stream = await gw.client().chat.completions.create(
        model="pool", messages=MSG, stream=True,
        extra_body={"fake": {"fault": "500", "fail_times": 1}})
    _ = [c async for c in stream]  # first attempt 500 (ejects it), the failover answers
    rows = await gw.wait_rows(1)
    assert rows[0]["route_reason"] == "failover" and rows[0]["retries"] == 1
    text = await gw.metrics_text()
    assert 'gateway_deployment_ejected{deployment="fake/' in text
    ejected = [ln for ln in text.splitlines()
               if ln.startswith("gateway_deployment_ejected{") and ln.endswith(" 1.0")]
    assert len(ejected) == 1
    await asyncio.sleep(0.35)
    await _ask(gw)  # the decision after the back-off takes it back
    text = await gw.metrics_text()
    assert not [ln for ln in text.splitlines()
                if ln.startswith("gateway_deployment_ejected{") and ln.endswith(" 1.0")]


def test_answered_requests_leave_the_pending_queue():
    stats = DeploymentStats(99.0)
    for i in range(1000):
        rec = SimpleNamespace(stream=True, t_first_ns=None, status=0)
        stats.opened(rec, time.monotonic())
        rec.t_first_ns = i + 1  # its first token came
    assert len(stats.pending) == 1  # only the newest, not yet looked at again
