"""``python -m gateway --workers N``: N gateway processes serving one port.

The supervisor (this module, no event loop of its own) reserves the port, starts N workers
(``python -m gateway ... --worker-id i``), and restarts any worker that dies (logged, with a
one-second pause when a worker dies within a second of starting, so a crash loop does not
spin). Each worker is a complete gateway bound with ``SO_REUSEPORT``: the kernel spreads new
connections across the workers' listening sockets, each accepting on its own core.

Shared state:

- ``/metrics``: prometheus-client's multiprocess mode. Every worker writes its values to
  memory-mapped files in ``PROMETHEUS_MULTIPROC_DIR`` (the operator's, emptied at start, else
  a temporary directory removed at exit); any worker's ``/metrics`` reads all of them.
  Counters and histograms are summed over all workers, including dead ones (totals survive a
  restart); ``gateway_in_flight_requests`` is summed over live workers; gauges
  ``gateway_deployment_ejected`` show the maximum over live workers (1 if any worker has the
  deployment ejected: each worker ejects on its own evidence).
- The request log: every worker appends to the same file in whole-line writes (appendlog.py).
- Key limits: per worker in memory; ``limits.store: redis://...`` shares them (limits.py).

SIGTERM / SIGINT to the supervisor is passed on to every worker, which stops accepting and
lets its open requests finish (``shutdown_grace_seconds``); the supervisor exits 0 once all
have exited (a worker still running ``shutdown_grace_seconds`` + 10 s later is killed).
"""
from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.multiprocess import mark_process_dead

from gateway.metrics import MULTIPROC_ENV

log = logging.getLogger("gateway.workers")
_STDOUT = threading.Lock()


def _say(line: str) -> None:
    """One whole line to stdout: the supervisor's own line and the workers' passed-on lines
    come from different threads, and print() writes the text and its newline separately."""
    with _STDOUT:
        sys.stdout.write(line)
        sys.stdout.flush()
CRASH_LOOP_SECONDS = 1.0
READY_TIMEOUT_SECONDS = 60.0


def worker_count(value: str) -> int:
    """``--workers``: a positive integer, or ``auto`` (the cores this process may run on)."""
    if value == "auto":
        try:
            return len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer or 'auto', got "
                                         f"{value!r}")
    return n


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    started: float
    ready: threading.Event = field(default_factory=threading.Event)


class Supervisor:
    def __init__(self, worker_args: list[str], workers: int, host: str, port: int,
                 grace_s: float) -> None:
        """``worker_args``: the command line each worker runs after ``python -m gateway``
        (without ``--host/--port/--worker-id``)."""
        self.worker_args = worker_args
        self.n = workers
        self.host = host
        self.port = port
        self.grace_s = grace_s
        self.workers: list[_Worker] = []
        self.restarts = 0
        self._stop = threading.Event()
        self._reserved: socket.socket | None = None
        self._own_dir = False
        self.metrics_dir = ""

    # ---- setup -------------------------------------------------------------------------------
    def _reserve_port(self) -> int:
        """Bind (not listen) with SO_REUSEPORT: holds the port, and with port 0 picks the one
        every worker then binds. A socket that does not listen gets no connections."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((self.host, self.port))
        self._reserved = sock
        return sock.getsockname()[1]

    def _metrics_dir(self) -> str:
        path = os.environ.get(MULTIPROC_ENV)
        if path:
            Path(path).mkdir(parents=True, exist_ok=True)
            for stale in Path(path).glob("*.db"):  # values of an earlier run
                stale.unlink()
            return path
        self._own_dir = True
        return tempfile.mkdtemp(prefix="gateway-metrics-")

    def _spawn(self, index: int) -> _Worker:
        cmd = [sys.executable, "-m", "gateway", *self.worker_args, "--host", self.host,
               "--port", str(self.port), "--worker-id", str(index)]
        env = {**os.environ, MULTIPROC_ENV: self.metrics_dir}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
        worker = _Worker(index, proc, time.monotonic())
        threading.Thread(target=self._read_stdout, args=(worker,), daemon=True).start()
        log.info("worker %d started (pid %d)", index, proc.pid)
        return worker

    @staticmethod
    def _read_stdout(worker: _Worker) -> None:
        """A worker's first line is its ``listening ...``; later lines are passed on."""
        assert worker.proc.stdout is not None
        for line in worker.proc.stdout:
            if not worker.ready.is_set() and line.startswith("listening "):
                worker.ready.set()
            else:
                _say(line)

    # ---- run ---------------------------------------------------------------------------------
    def run(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self._stop.set())
        self.port = self._reserve_port()
        self.metrics_dir = self._metrics_dir()
        try:
            self.workers = [self._spawn(i) for i in range(self.n)]
            if not self._wait_ready():
                return 1
            _say(f"listening http://{self.host}:{self.port}\n")
            log.info("gateway listening on http://%s:%d with %d workers", self.host,
                     self.port, self.n)
            while not self._stop.wait(0.2):
                self._restart_dead()
            self._drain()
            return 0
        finally:
            for w in self.workers:  # whatever is left (an error above): no orphans
                if w.proc.poll() is None:
                    w.proc.kill()
                    w.proc.wait()
            if self._reserved is not None:
                self._reserved.close()
            if self._own_dir:
                shutil.rmtree(self.metrics_dir, ignore_errors=True)

    def _wait_ready(self) -> bool:
        end = time.monotonic() + READY_TIMEOUT_SECONDS
        for w in self.workers:
            while not w.ready.wait(0.1):
                if w.proc.poll() is not None or time.monotonic() > end or self._stop.is_set():
                    log.error("worker %d did not start (exit status %s)", w.index,
                              w.proc.returncode)
                    return False
        return True

    def _restart_dead(self) -> None:
        for i, w in enumerate(self.workers):
            status = w.proc.poll()
            if status is None:
                continue
            mark_process_dead(w.proc.pid, self.metrics_dir)  # its live gauges leave
            self.restarts += 1
            log.warning("worker %d (pid %d) exited with status %s; restarting it (restart %d)",
                        w.index, w.proc.pid, status, self.restarts)
            if time.monotonic() - w.started < CRASH_LOOP_SECONDS:
                time.sleep(CRASH_LOOP_SECONDS)
            self.workers[i] = self._spawn(w.index)

    def _drain(self) -> None:
        log.info("shutting down: %d workers finish their open requests (up to %.0fs)",
                 len(self.workers), self.grace_s)
        for w in self.workers:
            if w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        end = time.monotonic() + self.grace_s + 10
        for w in self.workers:
            try:
                w.proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("worker %d (pid %d) did not stop in time: killed", w.index,
                          w.proc.pid)
                w.proc.kill()
                w.proc.wait()
            mark_process_dead(w.proc.pid, self.metrics_dir)
