"""Run a fake upstream on its own event-loop thread, for code that is not asyncio (Locust)."""
from __future__ import annotations

import asyncio
import threading
from typing import Any, Callable

from fakeupstream.plan import FakeConfig
from fakeupstream.server import FakeUpstream


def run_in_thread(config: FakeConfig | None = None,
                  timeout_s: float = 10.0) -> tuple[str, Callable[[], None]]:
    """Start a FakeUpstream on its own event loop thread; returns (base_url, stop)."""
    fake = FakeUpstream(config)
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    box: dict[str, Any] = {}

    def _run() -> None:
        asyncio.set_event_loop(loop)
        try:
            box["url"] = loop.run_until_complete(fake.start())
        except BaseException as exc:  # surface bind errors to the caller
            box["error"] = exc
            ready.set()
            return
        ready.set()
        loop.run_forever()
        loop.run_until_complete(fake.stop())
        loop.close()

    thread = threading.Thread(target=_run, name="fake-upstream", daemon=True)
    thread.start()
    if not ready.wait(timeout_s) or "error" in box:
        raise RuntimeError(f"fake upstream did not start: {box.get('error')}")

    def stop() -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout_s)

    stop.fake = fake  # type: ignore[attr-defined]  # lets callers inspect .received/.stats
    return box["url"], stop
