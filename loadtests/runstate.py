"""Per-process state of a chat load test: settings, prompts, arrivals, records, monitor.

One ``RunState`` lives on each Locust process (``environment.firsttoken``). The master or the
single local process owns the records file (a ``RecordSink``); workers batch their records and
monitor samples to it every half second and once more when they stop.
"""
from __future__ import annotations

import gc
import logging
import time
from typing import Any

import gevent
from gevent.lock import Semaphore

from loadtests import settings as settings_mod
from loadtests.generator import ArrivalSchedule, GeneratorMonitor, MonitorSamples
from loadtests.prompts import (LocalTokenCounter, PromptFactory, ServerTokenCounter,
                               default_tokenize_url, load_prompts_file)
from loadtests.records import RecordSink, build_summary, format_summary, summary_path
from loadtests.records import write_summary as save_summary
from loadtests.sse import RequestRecord

log = logging.getLogger("firsttoken.loadtest")
RECORDS_MESSAGE = "firsttoken_records"
_FLUSH_INTERVAL_S = 0.5


class _WordCounter:
    """Last resort when no /tokenize and no --tokenizer: one token per word (marked inexact)."""

    def count_text(self, text: str) -> int:
        return len(text.split())

    def count_messages(self, messages: list[dict]) -> int | None:
        return None

    def close(self) -> None:
        pass


def _is_worker(environment: Any) -> bool:
    from locust.runners import WorkerRunner
    return isinstance(environment.runner, WorkerRunner)


def _is_master(environment: Any) -> bool:
    from locust.runners import MasterRunner
    return isinstance(environment.runner, MasterRunner)


class RunState:
    def __init__(self, environment: Any) -> None:
        self.env = environment
        self.settings: settings_mod.LoadSettings | None = None
        self.prompts: PromptFactory | None = None
        self.schedule: ArrivalSchedule | None = None
        self.monitor = GeneratorMonitor()
        self.sink: RecordSink | None = None
        self._lock = Semaphore()
        self._ready = False
        self._started = 0          # requests started by this process (warm-up accounting)
        self._pending: list[RequestRecord] = []
        self._flusher: gevent.Greenlet | None = None
        self._remote_exact: bool | None = None  # master: workers' prompt_lengths_exact

    # --- lifecycle -----------------------------------------------------------------------
    def on_test_start(self) -> None:
        self.settings = settings_mod.resolve(self.env.parsed_options)
        if not _is_worker(self.env):
            settings_mod.write_back(self.env.parsed_options, self.settings)  # -> workers
            if self.sink is not None:  # a new test from the web UI: a fresh file
                self.sink.close()
            self.sink = RecordSink(self.settings.records, self.settings.measure_requests,
                                   on_target=self._target_reached)
        if _is_master(self.env):
            return  # the master sends nothing itself
        self._ready, self._started, self._pending = False, 0, []
        # A full GC pass over Locust's ~10^5 start-up objects stalls every greenlet for
        # milliseconds; frozen objects are never scanned again. The monitor records any
        # collection that still takes >= 1 ms (gc_pauses_ms in the summary).
        gc.collect()
        gc.freeze()
        self.monitor.start()
        if _is_worker(self.env):
            self._flusher = gevent.spawn(self._flush_loop)

    def on_test_stop(self) -> None:
        if _is_worker(self.env):
            if self._flusher is not None:
                self._flusher.kill(block=False)
                self._flusher = None
            self.flush()  # reaches the master before this worker's "client_stopped"
        self.monitor.stop()
        self.write_summary(echo=True)

    def on_quitting(self) -> None:
        self.write_summary(echo=False)
        if self.sink is not None:
            self.sink.close()

    def prepare(self, host: str) -> None:
        """Build prompts and the arrival schedule once per process (first user to start)."""
        with self._lock:
            if self._ready:
                return
            if self.settings is None:
                self.settings = settings_mod.resolve(self.env.parsed_options)
            s = self.settings
            texts = load_prompts_file(s.prompts_file) if s.prompts_file else None
            counter = self._counter(host)
            try:
                self.prompts = PromptFactory(counter, s.prompt_tokens, s.endpoint == "chat",
                                             texts, seed=s.seed + self.worker_index)
            finally:
                counter.close()
            if isinstance(counter, _WordCounter):
                self.prompts.exact = False
            if not self.prompts.exact and s.prompt_tokens:
                log.warning("prompt lengths are approximate (no usable /tokenize or "
                            "--tokenizer); see prompt_tokens in the records")
            if s.arrival != "closed":
                self.schedule = ArrivalSchedule(s.arrival, s.rate, s.seed, self.worker_index,
                                                self._processes())
            self._ready = True

    def _counter(self, host: str) -> Any:
        s = self.settings
        assert s is not None
        if s.tokenizer:
            return LocalTokenCounter(s.tokenizer)
        url = s.tokenize_url or default_tokenize_url(host)
        counter = ServerTokenCounter(url, s.model, s.api_key)
        try:
            counter.count_text("probe")
            return counter
        except Exception as exc:  # 404 from a gateway, connection refused ...
            counter.close()
            log.warning("POST %s unusable (%s); counting words instead", url, exc)
            return _WordCounter()

    # --- per request ---------------------------------------------------------------------
    def take_ticket(self) -> tuple[str, float | None]:
        """("warmup"|"measure", intended send time or None for closed loop)."""
        assert self.settings is not None
        self._started += 1
        if self._started <= self.settings.warmup_requests:
            return "warmup", None
        if self._started == self.settings.warmup_requests + 1:
            self.monitor.drain()  # generator samples from the warm-up are excluded too
        return "measure", self.schedule.next_slot() if self.schedule else None

    def emit(self, record: RequestRecord) -> None:
        if _is_worker(self.env):
            self._pending.append(record)
        elif self.sink is not None:
            self.sink.add([record])

    @property
    def worker_index(self) -> int:
        idx = getattr(self.env.runner, "worker_index", 0)
        return max(int(idx), 0)

    def _processes(self) -> int:
        if _is_worker(self.env):
            return max(int(getattr(self.env.parsed_options, "expect_workers", 1) or 1), 1)
        return 1

    # --- distributed: worker -> master ---------------------------------------------------
    def _flush_loop(self) -> None:
        while True:
            gevent.sleep(_FLUSH_INTERVAL_S)
            self.flush()

    def flush(self) -> None:
        batch, self._pending = self._pending, []
        samples = self.monitor.drain()
        self.env.runner.send_message(RECORDS_MESSAGE, {
            "records": [r.to_json() for r in batch], "monitor": samples.to_dict(),
            "prompt_exact": self.prompts.exact if self.prompts else None})

    def on_records_message(self, msg: Any, **_kw: Any) -> None:
        """Master: a batch from a worker."""
        import json
        if self.sink is None:
            return
        self.sink.monitor.extend(MonitorSamples.from_dict(msg.data.get("monitor", {})))
        if msg.data.get("prompt_exact") is not None:  # exact only if every worker's was
            self._remote_exact = bool(msg.data["prompt_exact"]) and self._remote_exact is not False
        self.sink.add(RequestRecord.from_dict(json.loads(r)) for r in msg.data["records"])

    # --- end of run ------------------------------------------------------------------------
    def _target_reached(self) -> None:
        log.info("firsttoken: %d measured requests recorded, stopping",
                 self.settings.measure_requests if self.settings else 0)
        gevent.spawn(self._stop_runner)

    def _stop_runner(self) -> None:
        runner = self.env.runner
        headless = bool(getattr(self.env.parsed_options, "headless", False))
        runner.stop()  # master: waits for workers, whose last records arrive first
        if headless:
            runner.quit()

    def write_summary(self, echo: bool) -> None:
        if self.sink is None or self.settings is None:
            return
        if not _is_master(self.env):  # local: this process's own samples
            self.sink.monitor.extend(self.monitor.drain())
        s = self.settings
        public = s.model_dump(exclude={"api_key"})  # keys never logged
        summary = build_summary(self.sink.records, public, self.sink.monitor,
                                s.rate if s.arrival != "closed" else 0.0)
        summary["prompt_lengths_exact"] = (self.prompts.exact if self.prompts
                                           else self._remote_exact)
        summary["written_unix"] = time.time()
        save_summary(summary_path(self.sink.path), summary)
        if echo:
            log.info("%s", format_summary(summary))
