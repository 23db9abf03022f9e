"""``/healthz`` latency with 1,000 idle client sockets held open against the gateway, next to
the same measurement without them, and whether the gateway closes the idle ones.

    python -m benchmarks.idle_health [--idle 1000] [--probes 200] [--json PATH]

The gateway runs as its own process (``python -m gateway``, idle timeout 5 s) over an
in-process fake upstream. Probes are sequential GETs on one keep-alive connection; one
streamed chat completion is timed alongside. The gateway's open descriptors are read from
``/proc/<pid>/fd`` before any client connects, while the sockets are held, and after its
idle timeout closed them (one more for the upstream keep-alive connection it may still hold).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from fakeupstream import FakeConfig, FakeUpstream

KEY = "sk-idle-health"
IDLE_TIMEOUT_S = 5.0


async def _probe(session: aiohttp.ClientSession, url: str, n: int) -> dict[str, float]:
    lat = []
    for _ in range(n):
        t = time.perf_counter()
        async with session.get(url + "/healthz") as r:
            await r.read()
            assert r.status == 200
        lat.append((time.perf_counter() - t) * 1000)
    lat.sort()
    return {"p50_ms": round(statistics.median(lat), 3),
            "p99_ms": round(lat[int(len(lat) * 0.99) - 1], 3), "max_ms": round(lat[-1], 3)}


async def _stream_ms(session: aiohttp.ClientSession, url: str) -> float:
    body = {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    t = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers={"Authorization": f"Bearer {KEY}"}) as r:
        text = (await r.read()).decode()
    assert r.status == 200 and text.rstrip().endswith("data: [DONE]"), text[-200:]
    return round((time.perf_counter() - t) * 1000, 3)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def measure(idle: int = 1000, probes: int = 200) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tmp = Path(tempfile.mkdtemp(prefix="idle-health-"))
    async with FakeUpstream(FakeConfig(ttft_ms=5, itl_ms=1, tokens=16)) as fake:
        cfg = {"keys": [{"name": "bench", "env": "IDLE_KEY"}],
               "providers": {"fake": {"base_url": fake.base_url}},
               "models": {"fast": {"provider": "fake", "model": "m"}},
               "server": {"idle_timeout_seconds": IDLE_TIMEOUT_S}}
        (tmp / "gateway.yaml").write_text(yaml.safe_dump(cfg))
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--config", str(tmp / "gateway.yaml"),
             "--port", "0", "--log-level", "WARNING"],
            stdout=subprocess.PIPE, env={**os.environ, "IDLE_KEY": KEY}, text=True)
        try:
            assert proc.stdout is not None
            line = await asyncio.to_thread(proc.stdout.readline)
            url = line.split()[-1]
            host, port = url.rsplit("//", 1)[1].rsplit(":", 1)
            fds0 = _fds(proc.pid)  # no client connection yet
            async with aiohttp.ClientSession() as s:
                await _probe(s, url, 20)  # warm-up
                base = await _probe(s, url, probes)
                base_stream = await _stream_ms(s, url)
                socks = [await asyncio.open_connection(host, int(port)) for _ in range(idle)]
                await asyncio.sleep(0.5)
                fds_held = _fds(proc.pid)
                held = await _probe(s, url, probes)
                held_stream = await _stream_ms(s, url)
                t_open = time.perf_counter()
                closed = await asyncio.gather(*(_eof(r, IDLE_TIMEOUT_S * 3) for r, _ in socks))
                closed_after = time.perf_counter() - t_open
                for _, w in socks:
                    w.close()
            await asyncio.sleep(0.5)
            fds_after = _fds(proc.pid)  # + the upstream keep-alive connection, if still open
        finally:
            proc.terminate()
            proc.wait(10)
    return {
        "idle_sockets": idle, "probes": probes, "idle_timeout_s": IDLE_TIMEOUT_S,
        "healthz_no_idle": base, "healthz_with_idle": held,
        "stream_ms_no_idle": base_stream, "stream_ms_with_idle": held_stream,
        "gateway_fds": {"before": fds0, "holding": fds_held, "after_idle_timeout": fds_after},
        "idle_closed_by_gateway": sum(closed), "all_closed_within_s": round(closed_after, 2),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python "
                   f"{platform.python_version()}",
    }


async def _eof(reader: asyncio.StreamReader, within: float) -> bool:
    try:
        async with asyncio.timeout(within):
            return await reader.read() == b""
    except (TimeoutError, ConnectionError):
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.idle_health", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--idle", type=int, default=1000)
    p.add_argument("--probes", type=int, default=200)
    p.add_argument("--json", help="write the result here")
    a = p.parse_args(argv)
    result = asyncio.run(measure(a.idle, a.probes))
    result["command"] = "python -m benchmarks.idle_health " + " ".join(
        argv if argv is not None else sys.argv[1:])
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
