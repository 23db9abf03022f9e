"""AsyncEngine: the engine loop in its own thread, bridged to asyncio.

The event loop never runs torch: ``generate`` posts an add command to a thread-safe queue
and awaits a per-request ``OutputChannel``; the engine thread drains the commands between
steps, runs a step, and hands the step's outputs back with one
``loop.call_soon_threadsafe`` per step, as soon as ``step()`` returns them (with overlap
scheduling these are the previous step's tokens, handed over while the device runs the
next step). Leaving ``generate`` early (client gone, task
cancelled) posts an abort, which the engine applies before its next step, freeing the
request's blocks.
"""
from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from pathlib import Path
from typing import AsyncIterator, Callable

from backend.engine.config import EngineConfig
from backend.engine.errors import EngineNotRunning, StepFailed
from backend.engine.outputs import EngineStats, RequestOutput, StepStats
from backend.engine.sampling import SamplingParams
from backend.profiling.capture import CaptureJob, StepProfiler

log = logging.getLogger(__name__)
_IDLE_WAIT_S = 0.5  # how long the idle engine thread blocks for a command before re-checking
_PROFILE_EXPORT_WAIT_S = 300.0  # a stopped capture's export; bounded if the engine is gone


class AsyncEngine:
    def __init__(self, config: EngineConfig, source,
                 step_observer: Callable[[StepStats], None] | None = None) -> None:
        self.config = config
        self.source = source
        self.step_observer = step_observer
        self.max_model_len = 0  # known once start() has built the engine
        self._engine = None
        self._thread: threading.Thread | None = None
        self._commands: queue.Queue = queue.Queue()
        self._queues: dict[str, OutputChannel] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = threading.Event()
        self._profiler = StepProfiler()  # engine-thread owned; driven by commands

    @property
    def engine(self):
        """The underlying LLMEngine (for tests and introspection; owned by the thread)."""
        return self._engine

    async def start(self) -> None:
        """Builds the model and KV cache in the engine thread; returns when it is ready."""
        self._loop = asyncio.get_running_loop()
        ready: asyncio.Future = self._loop.create_future()
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, args=(ready,), name="engine",
                                        daemon=True)
        self._thread.start()
        await ready
        self.max_model_len = self._engine.max_model_len

    async def stop(self) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        self._commands.put(("wake",))
        await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 30.0)
        self._thread = None

    def check_request(self, prompt_len: int, params: SamplingParams) -> None:
        """Raises RequestRejected for a request the engine can never serve."""
        if self._engine is None:
            raise EngineNotRunning("the engine is not started")
        self._engine.check_request(prompt_len, params)

    async def generate(self, request_id: str, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        self.check_request(len(prompt_token_ids), params)
        if request_id in self._queues:
            raise ValueError(f"duplicate request id {request_id!r}")
        out = OutputChannel()
        self._queues[request_id] = out
        self._commands.put(("add", request_id, list(prompt_token_ids), params,
                            time.perf_counter_ns()))
        finished = False
        try:
            while True:
                item = await out.get()
                if isinstance(item, BaseException):
                    finished = True  # the engine already dropped it
                    raise item
                finished = item.finished
                yield item
                if finished:
                    return
        finally:
            self._queues.pop(request_id, None)
            if not finished:
                self.abort(request_id)

    def abort(self, request_id: str) -> None:
        self._commands.put(("abort", request_id))

    def stats(self) -> EngineStats:
        if self._engine is None:
            raise EngineNotRunning("the engine is not started")
        return self._engine.stats()

    @property
    def _cuda(self) -> bool:
        return str(self.config.device).startswith("cuda")

    def warm_profiler(self) -> None:
        """Initialise the profiler in the engine thread now, not inside the first capture."""
        self._commands.put(("profile_warm",))

    async def profile(self, steps: int, out_dir: Path, timeout_s: float,
                      name: str = "profile") -> dict:
        """Profile the next ``steps`` engine steps in the engine thread; the report (see
        backend.profiling.summary) once the trace is written. After ``timeout_s`` without
        enough steps (an idle engine) it ends the capture and reports what it holds; a
        cancelled caller ends it too."""
        if self._engine is None:
            raise EngineNotRunning("the engine is not started")
        loop = asyncio.get_running_loop()
        done: asyncio.Future = loop.create_future()

        def deliver(result: dict | BaseException) -> None:
            setter = _set_exception if isinstance(result, BaseException) else _set_value
            loop.call_soon_threadsafe(setter, done, result)

        job = CaptureJob(steps, out_dir, deliver, name, cuda=self._cuda)
        self._commands.put(("profile", job))
        try:
            return await asyncio.wait_for(asyncio.shield(done), timeout_s)
        except asyncio.TimeoutError:
            self._commands.put(("profile_stop",))
            # the stop is applied between two steps; the export takes seconds on big traces
            return await asyncio.wait_for(done, _PROFILE_EXPORT_WAIT_S)
        except asyncio.CancelledError:
            self._commands.put(("profile_stop",))
            raise

    # -- engine thread ----------------------------------------------------------------
    def _run(self, ready: asyncio.Future) -> None:
        try:
            from backend.engine.llm_engine import LLMEngine

            self._engine = LLMEngine(self.config, self.source, self.step_observer)
        except BaseException as exc:  # noqa: BLE001 - handed to start()'s caller
            self._loop.call_soon_threadsafe(_set_exception, ready, exc)
            return
        self._loop.call_soon_threadsafe(_set_result, ready)
        while not self._stopping.is_set():
            self._apply_commands(block=not self._engine.has_unfinished())
            if not self._engine.has_unfinished():
                continue
            try:
                outputs = self._profiler.run_step(self._engine.step)
            except Exception as exc:  # noqa: BLE001 - outside the model run (the scheduler):
                # nothing narrows it down, so fail the in-flight requests and keep serving
                log.exception("engine step failed")
                self._fail_all(StepFailed(f"{type(exc).__name__}: {exc}"))
                continue
            if outputs:
                self._loop.call_soon_threadsafe(self._deliver, outputs)
        self._profiler.stop_early()  # a capture still waiting gets what it has
        try:
            self._fail_all(EngineNotRunning("the engine stopped"))
        except RuntimeError:  # the event loop is already closed: nobody is waiting
            pass

    def _apply_commands(self, block: bool) -> None:
        try:
            cmd = self._commands.get(timeout=_IDLE_WAIT_S) if block \
                else self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            self._apply(cmd)
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return

    def _apply(self, cmd: tuple) -> None:
        if cmd[0] == "add":
            _, rid, prompt, params, arrival = cmd
            try:
                self._engine.add_request(rid, prompt, params, arrival)
            except Exception as exc:  # noqa: BLE001 - e.g. rejected: goes to the caller
                self._loop.call_soon_threadsafe(self._deliver_error, rid, exc)
        elif cmd[0] == "abort":
            out = self._engine.abort_request(cmd[1])
            if out is not None:
                self._loop.call_soon_threadsafe(self._deliver, [out])
        elif cmd[0] == "profile":
            self._profiler.start(cmd[1])
        elif cmd[0] == "profile_warm":
            self._profiler.warm(self._cuda)
        elif cmd[0] == "profile_stop":
            self._profiler.stop_early()

    def _fail_all(self, exc: Exception) -> None:
        for rid in list(self._engine.seqs):
            self._engine.abort_request(rid)
            self._loop.call_soon_threadsafe(self._deliver_error, rid, exc)

    # -- event loop side --------------------------------------------------------------
    def _deliver(self, outputs: list[RequestOutput]) -> None:
        queues = self._queues
        for out in outputs:
            q = queues.get(out.request_id)
            if q is not None:
                q.put(out)

    def _deliver_error(self, request_id: str, exc: Exception) -> None:
        q = self._queues.get(request_id)
        if q is not None:
            q.put(exc)


class OutputChannel:
    """One request's outputs on the event loop: a deque and at most one waiting reader.

    Every streamed token passes through here once, so it does only that: asyncio.Queue's
    bookkeeping (size limit, waiting writers, unfinished-task count and its Event) would run
    for every token of every request. Event-loop side only.
    """

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None

    def put(self, item: object) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> object:
        items = self._items
        while not items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        return items.popleft()


def _set_result(fut: asyncio.Future) -> None:
    if not fut.done():
        fut.set_result(None)


def _set_value(fut: asyncio.Future, value: object) -> None:
    if not fut.done():
        fut.set_result(value)


def _set_exception(fut: asyncio.Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
