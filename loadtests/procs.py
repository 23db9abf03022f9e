"""Stopping the servers and tools the benches and sweeps start as child processes."""
from __future__ import annotations

import subprocess


def stop_process(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM, wait up to ``grace_s`` for a clean exit (servers drain), then SIGKILL."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
