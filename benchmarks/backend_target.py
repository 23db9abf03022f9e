"""The local backend on the embedded model as a child process, for the reliability
benchmarks: start it on a free port, watch its health, KV blocks, RSS and log."""
from __future__ import annotations

import json
import os
import platform
import re
import time
import urllib.request
from dataclasses import dataclass

import psutil

from loadtests.procs import free_port
from loadtests.sweep_backend import BackendProcess

MODEL = "smollm2-135m-instruct"
# A small KV pool and context keep the process light next to other work on a small machine.
DEFAULT_ARGS = ("--kv-cache-memory", "0.25", "--max-model-len", "2048")
_ERROR_LINE = re.compile(r" (ERROR|CRITICAL) |Traceback \(most recent call last\)")


@dataclass
class Health:
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int


class BackendTarget:
    """``python -m backend`` on a free loopback port; use as a context manager."""

    def __init__(self, log_path: str, max_num_seqs: int = 8,
                 extra: tuple[str, ...] = DEFAULT_ARGS) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self._max_num_seqs = max_num_seqs
        self._proc = BackendProcess(MODEL, self.port, extra)

    def __enter__(self) -> "BackendTarget":
        self._proc.restart(self._max_num_seqs, self.log_path)
        return self

    def __exit__(self, *exc: object) -> None:
        self._proc.stop()

    @property
    def alive(self) -> bool:
        pid = self._proc.pid
        return pid is not None and psutil.pid_exists(pid) and \
            psutil.Process(pid).status() != psutil.STATUS_ZOMBIE

    def rss_bytes(self) -> int:
        return psutil.Process(self._proc.pid).memory_info().rss

    def health(self, timeout_s: float = 10.0) -> Health:
        with urllib.request.urlopen(f"{self.base_url}/health", timeout=timeout_s) as resp:
            h = json.load(resp)
        return Health(h["requests_running"], h["requests_waiting"], h["kv_blocks_used"],
                      h["kv_blocks_total"])

    def wait_idle(self, timeout_s: float = 30.0) -> Health:
        """Health once nothing runs or waits (aborts reach the engine a moment later)."""
        deadline = time.monotonic() + timeout_s
        h = self.health()
        while time.monotonic() < deadline and (h.running or h.waiting or h.kv_blocks_used):
            time.sleep(0.1)
            h = self.health()
        return h

    def error_lines(self) -> list[str]:
        """ERROR/CRITICAL lines and tracebacks in the backend's log so far."""
        with open(self.log_path, errors="replace") as f:
            return [line.rstrip() for line in f if _ERROR_LINE.search(line)]


def machine() -> dict:
    """Where a result was measured (the load average says how shared the machine was)."""
    return {"cpus": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "loadavg_1m": os.getloadavg()[0]}


def write_result(path: str | None, result: dict) -> None:
    """The result as JSON at path (folders made as needed); nothing when path is None."""
    if path:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
