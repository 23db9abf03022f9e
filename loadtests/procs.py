"""Stopping the servers and tools the benches and sweeps start as child processes."""
from __future__ import annotations

import socket
import subprocess


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for servers that need one up front)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM, wait up to ``grace_s`` for a clean exit (servers drain), then SIGKILL.
    ``grace_s=0`` kills at once (a process that failed to start, or one cut off at a time
    limit). Either way the child is reaped."""
    if proc.poll() is not None:
        return
    if grace_s <= 0:
        proc.kill()
        proc.wait(10)
        return
    proc.terminate()
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)
