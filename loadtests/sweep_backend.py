"""The local backend, restarted by the sweep for each batch size with ``--max-num-seqs``."""
from __future__ import annotations

import subprocess
import sys

from loadtests.observe import wait_http_ok
from loadtests.procs import stop_process


class BackendProcess:
    """``python -m backend --model M --port P --max-num-seqs B [extra]`` as a child process."""

    def __init__(self, model: str, port: int, extra: tuple[str, ...] = (),
                 start_timeout_s: float = 600.0) -> None:
        self.model, self.port, self.extra = model, port, extra
        self.start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen | None = None
        self._log = None

    def restart(self, max_num_seqs: int, log_path: str) -> None:
        self.stop()
        self._log = open(log_path, "w")
        cmd = [sys.executable, "-m", "backend", "--model", self.model, "--host", "127.0.0.1",
               "--port", str(self.port), "--max-num-seqs", str(max_num_seqs), *self.extra]
        self._proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT)
        if not wait_http_ok(f"http://127.0.0.1:{self.port}/health", self.start_timeout_s):
            self.stop()
            raise RuntimeError(f"backend did not become healthy on port {self.port} within "
                               f"{self.start_timeout_s:g} s; see {log_path}")

    @property
    def pid(self) -> int | None:
        """The running backend's process id (None when stopped)."""
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)
        self._proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
