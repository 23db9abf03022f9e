"""Run a backend app on a loopback ephemeral port in its own thread and event loop.

A thread (not the test's loop) so the synchronous openai client can call it too, exactly as a
separate process would, while the tests can still peek at the engine through ``call``.
"""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable, Coroutine

import uvloop
from aiohttp import web

from backend.server.app import start_app
from backend.server.handlers import STATE


class ServerThread:
    def __init__(self, make_app: Callable[[], web.Application]) -> None:
        self._make_app = make_app
        self._loop = uvloop.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="backend-test-server")
        self._runner: web.AppRunner | None = None
        self.app: web.Application | None = None
        self.base_url = ""

    def start(self, timeout: float = 300.0) -> "ServerThread":
        self._thread.start()
        self.app = self._make_app()
        self._runner, self.base_url = self.call(start_app(self.app, "127.0.0.1", 0), timeout)
        return self

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def state(self) -> Any:
        return self.app[STATE]

    def engine_stats(self) -> Any:
        async def get() -> Any:
            return self.state.engine.stats()
        return self.call(get())

    def stop(self) -> None:
        if self._runner is not None:
            self.call(self._runner.cleanup(), 120)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


async def wait_engine_idle(server: ServerThread, timeout_s: float = 10.0) -> Any:
    """The engine's stats once nothing runs, waits or holds a KV block (aborts and frees reach
    the engine a moment after the client's answer), or the last stats at the timeout."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        s = server.engine_stats()
        if (s.running, s.waiting, s.kv_blocks_used) == (0, 0, 0) or \
                asyncio.get_running_loop().time() > deadline:
            return s
        await asyncio.sleep(0.05)
