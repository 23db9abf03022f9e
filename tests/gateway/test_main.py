"""``python -m gateway`` as a real process: startup line, bad config, graceful SIGTERM."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys

import aiohttp

from tests.gateway.conftest import CLIENT_KEY


async def _spawn(config: str, *extra: str) -> asyncio.subprocess.Process:
    env = {**os.environ, "GATEWAY_API_KEY": CLIENT_KEY}
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "--config", config, "--port", "0", *extra,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env)


async def _refuses_new_connections(url: str, within_s: float) -> bool:
    """Poll until a fresh connection is refused (the listener closed) or time runs out."""
    loop = asyncio.get_running_loop()
    end = loop.time() + within_s
    while loop.time() < end:
        try:
            async with aiohttp.ClientSession() as s2:  # new session: no pooled connection
                async with s2.get(url + "/healthz") as r:
                    await r.read()
        except aiohttp.ClientConnectionError:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_bad_config_exits_2(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("providers: {p: {base_url: 'http://a'}}\nmodels: {}\nlistn: {}\n")
    proc = await _spawn(str(p))
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"'listn'" in err


async def test_sigterm_lets_open_stream_finish(fake, tmp_path):
    cfg = tmp_path / "gw.yaml"
    cfg.write_text(json.dumps({  # JSON is valid YAML
        "keys": [{"name": "default", "env": "GATEWAY_API_KEY"}],
        "providers": {"fake": {"base_url": fake.base_url}},
        "models": {"fast": {"provider": "fake", "model": "m"}},
        "request_log": str(tmp_path / "req.jsonl"), "shutdown_grace_seconds": 10}))
    proc = await _spawn(str(cfg))
    try:
        line = await asyncio.wait_for(proc.stdout.readline(), 30)
        assert line.startswith(b"listening http://127.0.0.1:")
        url = line.split()[1].decode()
        body = {"model": "fast", "stream": True, "messages": [{"role": "user", "content": "x"}],
                "fake": {"ttft_ms": 0, "itl_ms": 100, "tokens": 30}}  # a 3 s stream
        async with aiohttp.ClientSession() as s:
            async with s.post(url + "/v1/chat/completions", json=body,
                              headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as r:
                first = await r.content.readline()
                assert first.startswith(b"data:")
                proc.send_signal(signal.SIGTERM)
                assert await _refuses_new_connections(url, within_s=2.5)
                assert proc.returncode is None  # still serving the open stream
                rest = await asyncio.wait_for(r.content.read(), 20)
            assert rest.rstrip().endswith(b"data: [DONE]")  # finished, not cut
        assert await asyncio.wait_for(proc.wait(), 20) == 0
        rows = (tmp_path / "req.jsonl").read_text().splitlines()
        assert json.loads(rows[-1])["status"] == 200
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
