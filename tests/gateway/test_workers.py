"""``python -m gateway --workers 2`` as real processes: both serve one port, /metrics adds up
all workers, the shared request log has whole lines, a killed worker is restarted, SIGTERM
drains an open stream."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import sys

import aiohttp
import psutil
import pytest

from gateway.workers import worker_count
from tests.gateway.conftest import CLIENT_KEY

pytestmark = pytest.mark.timeout(120)
HEADERS = {"Authorization": f"Bearer {CLIENT_KEY}"}


def _body(**fake: object) -> dict:
    return {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "x"}],
            "fake": {"ttft_ms": 0, "itl_ms": 1, "tokens": 3, **fake}}


async def _post(url: str, **fake: object) -> bytes:
    async with aiohttp.ClientSession() as s:  # a new connection each time: spread by the kernel
        async with s.post(url + "/v1/chat/completions", json=_body(**fake),
                          headers=HEADERS) as r:
            assert r.status == 200
            return await r.read()


async def _metric_total(url: str, name: str) -> float:
    async with aiohttp.ClientSession() as s:
        async with s.get(url + "/metrics") as r:
            text = await r.text()
    return sum(float(m[1]) for m in re.finditer(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))


async def _settled_total(url: str, name: str, want: float, timeout: float = 10.0) -> float:
    """The total once it reached ``want`` (or the last value seen): a request is counted when
    its handler ends, which may be just after the client read the last byte."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while (value := await _metric_total(url, name)) != want and loop.time() < end:
        await asyncio.sleep(0.05)
    return value


@pytest.fixture
async def workers(fake, tmp_path):
    """Start a 2-worker gateway; yields (url, process, request-log path)."""
    cfg = tmp_path / "gw.yaml"
    log_path = tmp_path / "req.jsonl"
    cfg.write_text(json.dumps({
        "keys": [{"name": "default", "env": "GATEWAY_API_KEY"}],
        "providers": {"fake": {"base_url": fake.base_url}},
        "models": {"fast": {"provider": "fake", "model": "m"}},
        "request_log": str(log_path), "shutdown_grace_seconds": 10}))
    env = {**os.environ, "GATEWAY_API_KEY": CLIENT_KEY}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "--config", str(cfg), "--port", "0",
        "--workers", "2", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env)
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.startswith(b"listening http://127.0.0.1:"), line
        yield line.split()[1].decode(), proc, log_path
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for child in psutil.Process().children(recursive=True):  # orphaned workers, if any
            if child.pid != proc.pid and "gateway" in " ".join(child.cmdline()):
                child.kill()


def _tcp(proc: psutil.Process) -> list:
    """psutil >= 6 names it net_connections; 5.x connections."""
    return (getattr(proc, "net_connections", None) or proc.connections)("tcp")


def _worker_pids(proc: asyncio.subprocess.Process) -> set[int]:
    return {c.pid for c in psutil.Process(proc.pid).children()}


def test_worker_count():
    assert worker_count("3") == 3 and worker_count("auto") >= 1
    for bad in ("0", "-2", "many"):
        with pytest.raises(argparse.ArgumentTypeError, match="positive integer or 'auto'"):
            worker_count(bad)


async def test_two_workers_serve_and_metrics_add_up(workers, fake):
    url, proc, log_path = workers
    pids = _worker_pids(proc)
    assert len(pids) == 2
    await asyncio.gather(*(_post(url) for _ in range(40)))
    # Both workers served: each holds a kept-alive connection to the upstream.
    port = int(fake.base_url.rsplit(":", 1)[1].split("/")[0])
    serving = {pid for pid in pids
               if any(c.raddr and c.raddr.port == port for c in _tcp(psutil.Process(pid)))}
    assert serving == pids
    assert await _settled_total(url, "gateway_requests_total", 40) == 40
    for _ in range(4):  # every scrape (landing on either worker) counts all 40
        assert await _metric_total(url, "gateway_requests_total") == 40
        assert await _metric_total(url, "gateway_ttft_seconds_count") == 40
        assert await _metric_total(url, "gateway_in_flight_requests") == 0
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    rows = [json.loads(line) for line in log_path.read_text().splitlines()]  # whole lines
    assert len(rows) == 40 and {r["status"] for r in rows} == {200}
    assert len({r["request_id"] for r in rows}) == 40


async def test_killed_worker_is_restarted_and_totals_survive(workers):
    url, proc, _ = workers
    await asyncio.gather(*(_post(url) for _ in range(10)))
    assert await _settled_total(url, "gateway_requests_total", 10) == 10  # before the kill
    before = _worker_pids(proc)
    victim = min(before)
    os.kill(victim, signal.SIGKILL)
    for _ in range(200):
        now = _worker_pids(proc)
        if len(now) == 2 and victim not in now:
            break
        await asyncio.sleep(0.05)
    assert len(now) == 2 and victim not in now
    await asyncio.sleep(0.5)  # the new worker is listening
    await asyncio.gather(*(_post(url) for _ in range(10)))
    assert await _settled_total(url, "gateway_requests_total", 20) == 20  # the dead one's too
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    err = (await proc.stderr.read()).decode()
    assert re.search(rf"worker \d \(pid {victim}\) exited with status -9; restarting", err)


async def test_sigterm_drains_an_open_stream_in_every_worker(workers):
    url, proc, log_path = workers
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=_body(itl_ms=100, tokens=20),
                          headers=HEADERS) as r:  # a 2 s stream
            assert (await r.content.readline()).startswith(b"data:")
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            assert proc.returncode is None  # still serving the open stream
            rest = await asyncio.wait_for(r.content.read(), 20)
    assert rest.rstrip().endswith(b"data: [DONE]")  # finished, not cut
    assert await asyncio.wait_for(proc.wait(), 30) == 0
    rows = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert [r["status"] for r in rows] == [200]
