"""`make run`'s script for real: it refuses a taken port, says which key to use, and restarts
the backend when it dies while the gateway keeps running."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from loadtests.procs import free_port

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "run_local.sh"


def _env(backend_port: int, gateway_port: int, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_API_KEY"}
    env.update(PYTHON=sys.executable, BACKEND_PORT=str(backend_port),
               GATEWAY_PORT=str(gateway_port), GATEWAY_CONFIG=str(ROOT / "configs/gateway.yaml"),
               BACKEND_ARGS="--kv-cache-memory 0.1 --max-model-len 512",
               BACKEND_RESTART_DELAY="0.5", **extra)
    return env


def _ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return resp.status == 200
    except OSError:
        return False


def _wait(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.25)
    return False


@pytest.mark.parametrize("which", ["BACKEND_PORT", "GATEWAY_PORT"])
def test_a_taken_port_is_refused_with_a_clear_message(tmp_path, which):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {"BACKEND_PORT": free_port(), "GATEWAY_PORT": free_port(), which: port}
        proc = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60,
                              env=_env(ports["BACKEND_PORT"], ports["GATEWAY_PORT"]))
    assert proc.returncode != 0
    assert f"port {port} ({which}) is already in use" in proc.stderr
    assert "firsttoken is up" not in proc.stdout


def _backend_pids(root: int) -> list[int]:
    procs = psutil.Process(root).children(recursive=True)
    return [p.pid for p in procs if "backend" in p.cmdline() and "-m" in p.cmdline()]


@pytest.mark.slow
def test_the_backend_is_restarted_and_the_gateway_stays_up(tmp_path):
    backend_port, gateway_port = free_port(), free_port()
    log = open(tmp_path / "out.txt", "w+")
    proc = subprocess.Popen(["bash", str(SCRIPT)], cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, env=_env(backend_port, gateway_port),
                            start_new_session=True)
    try:
        up = _wait(lambda: "firsttoken is up" in (tmp_path / "out.txt").read_text(), 300)
        text = (tmp_path / "out.txt").read_text()
        assert up, text
        assert "using the development key sk-firsttoken-local" in text
        first = _backend_pids(proc.pid)
        assert len(first) == 1
        os.kill(first[0], signal.SIGKILL)
        assert _wait(lambda: not _ok(f"http://127.0.0.1:{backend_port}/health"), 30)
        assert _ok(f"http://127.0.0.1:{gateway_port}/healthz")  # the gateway lives on
        assert _wait(lambda: _ok(f"http://127.0.0.1:{backend_port}/health"), 300), \
            (tmp_path / "out.txt").read_text()
        second = _backend_pids(proc.pid)
        assert len(second) == 1 and second != first
        assert "the backend exited" in (tmp_path / "out.txt").read_text()
        assert proc.poll() is None and _ok(f"http://127.0.0.1:{gateway_port}/healthz")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
    assert _wait(lambda: not _ok(f"http://127.0.0.1:{gateway_port}/healthz"), 10)
    assert not _ok(f"http://127.0.0.1:{backend_port}/health")
