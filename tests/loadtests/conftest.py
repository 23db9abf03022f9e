"""Loopback servers and subprocess helpers for the load-test tests (ephemeral ports only)."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

from fakeupstream import FakeConfig, run_in_thread
from loadtests.procs import stop_process

ROOT = Path(__file__).resolve().parents[2]
CHAT_PY = str(ROOT / "loadtests" / "chat.py")
CLIENT_KEY = "sk-loadtest-client-5c1e"


@pytest.fixture
def lt_fake() -> Iterator[Callable[..., tuple[str, object]]]:
    """Factory: ``url, fake = lt_fake(ttft_ms=.., itl_ms=.., tokens=..)`` (stopped at teardown)."""
    stops = []

    def start(**kw: object) -> tuple[str, object]:
        url, stop = run_in_thread(FakeConfig(**kw))  # type: ignore[arg-type]
        stops.append(stop)
        return url, stop.fake  # type: ignore[attr-defined]

    yield start
    for stop in stops:
        stop()


def start_process(cmd: list[str], log: Path, env: dict | None = None,
                  timeout_s: float = 60.0) -> tuple[subprocess.Popen, str]:
    """Start a server that prints ``listening URL`` first; returns (process, URL)."""
    logf = open(log, "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=logf, text=True, cwd=ROOT,
                            env={**os.environ, **(env or {})})
    deadline = time.monotonic() + timeout_s
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{cmd[2]} exited with {proc.returncode}: {log.read_text()[-2000:]}")
        ready, _, _ = select.select([proc.stdout], [], [], 0.1)
        if ready:
            line = proc.stdout.readline()  # servers print and flush whole lines
            if line.startswith("listening "):
                return proc, line.split()[1]
    proc.kill()
    raise RuntimeError(f"{cmd} did not print 'listening URL' within {timeout_s}s")


def gateway_config(path: Path, upstream: str, log_path: Path, model: str = "fast",
                   upstream_model: str = "fake-model") -> Path:
    doc = {"listen": {"host": "127.0.0.1", "port": 0},
           "keys": [{"name": "loadtest", "env": "GATEWAY_API_KEY", "models": ["*"]}],
           "providers": {"up": {"base_url": upstream, "timeout_seconds": 120}},
           "models": {model: {"provider": "up", "model": upstream_model}},
           "request_log": str(log_path)}
    path.write_text(json.dumps(doc))  # JSON is valid YAML
    return path


@pytest.fixture
def lt_gateway(tmp_path: Path) -> Iterator[Callable[..., tuple[str, Path]]]:
    """Factory: ``url, request_log = lt_gateway(upstream_url)`` runs ``python -m gateway``."""
    procs = []

    def start(upstream: str, model: str = "fast", upstream_model: str = "fake-model"
              ) -> tuple[str, Path]:
        log = tmp_path / f"gateway-requests-{len(procs)}.jsonl"
        cfg = gateway_config(tmp_path / f"gateway-{len(procs)}.yaml", upstream, log, model,
                             upstream_model)
        proc, url = start_process([sys.executable, "-m", "gateway", "--config", str(cfg),
                                   "--port", "0"], tmp_path / f"gateway-{len(procs)}.log",
                                  env={"GATEWAY_API_KEY": CLIENT_KEY})
        procs.append(proc)
        return url, log

    yield start
    for p in procs:
        stop_process(p)


def run_locust(args: list[str], timeout_s: float = 90.0, cwd: Path = ROOT,
               env: dict | None = None) -> subprocess.CompletedProcess:
    """A headless Locust run of chat.py, bounded in time; the key goes through the env."""
    cmd = [sys.executable, "-m", "locust", "-f", CHAT_PY, "--headless", "--only-summary",
           "--stop-timeout", "5", *args]
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "GATEWAY_API_KEY": CLIENT_KEY, **(env or {})})


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
