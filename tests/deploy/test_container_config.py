"""The gateway as compose starts it (deploy/gateway.container.yaml, BACKEND_BASE_URL), on
loopback: a fake upstream stands in for the backend container, ports are ephemeral."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from tests.deploy.test_assets import DEPLOY, ROOT, compose

pytest.importorskip("gateway.config")
pytest.importorskip("fakeupstream")


def start(cmd: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """Start a server that prints `listening URL` first; return it and its URL."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith("listening "):
            return proc, line.split()[1].rstrip("/")
        if not line and proc.poll() is not None:
            break
    proc.kill()
    raise AssertionError(f"{cmd} did not start: {proc.stdout.read()[-2000:]}")


def get(url: str, headers: dict[str, str] | None = None, body: dict | None = None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json",
                                                          **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_compose_gateway_command_serves_through_the_backend_url(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TAOTOKEN_API_KEY"}
    upstream, up_url = start([sys.executable, "-m", "fakeupstream", "--host",
                              "127.0.0.1", "--port", "0", "--ttft-ms", "1", "--itl-ms", "1",
                              "--tokens", "3"], env)
    gateway = None
    try:
        # The compose command, with loopback and an ephemeral port instead of 0.0.0.0:8080.
        cmd = list(compose()["services"]["gateway"]["command"])
        cmd[cmd.index("--host") + 1] = "127.0.0.1"
        cmd[cmd.index("--port") + 1] = "0"
        cmd[0] = sys.executable
        log = tmp_path / "requests.jsonl"
        gw_env = dict(env, GATEWAY_API_KEY="sk-deploy-test", BACKEND_BASE_URL=f"{up_url}/v1",
                      GATEWAY_REQUEST_LOG=str(log))
        gateway, gw_url = start(cmd, gw_env)

        assert get(f"{gw_url}/healthz")[0] == 200
        status, body = get(f"{gw_url}/readyz")
        assert status == 200
        # No TaoToken key in the environment: listed, and named as missing.
        assert "missing TAOTOKEN_API_KEY" in body
        status, body = get(f"{gw_url}/v1/chat/completions",
                           {"Authorization": "Bearer sk-deploy-test"},
                           {"model": "smollm2", "max_tokens": 3,
                            "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200, body
        assert json.loads(body)["choices"][0]["message"]["content"]
        status, _ = get(f"{gw_url}/v1/chat/completions", {"Authorization": "Bearer wrong"},
                        {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}]})
        assert status == 401
        status, metrics = get(f"{gw_url}/metrics")
        assert status == 200
        assert 'gateway_requests_total{code="200",model="smollm2",provider="local"} 1.0' in metrics
        assert "sk-deploy-test" not in metrics
        # Two rows (the 200 and the 401), from two workers: their order is the flushes' order.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
                log.exists() and len(log.read_text().splitlines()) >= 2):
            time.sleep(0.05)
        rows = [json.loads(line) for line in log.read_text().splitlines()]
        assert sorted((r["status"], r["model"]) for r in rows) == [(200, "smollm2"), (401, None)]
    finally:
        for proc in (gateway, upstream):
            if proc is not None:
                proc.terminate()
                try:
                    proc.wait(timeout=40)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(timeout=10)


def test_container_config_file_is_the_one_compose_and_the_image_use():
    cmd = compose()["services"]["gateway"]["command"]
    assert cmd[cmd.index("--config") + 1] == "deploy/gateway.container.yaml"
    assert '"--config", "deploy/gateway.container.yaml"' in (DEPLOY / "Dockerfile").read_text()
