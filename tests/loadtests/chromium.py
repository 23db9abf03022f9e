"""Headless Chromium (Debian's `chromium` package) driven over the Chrome DevTools Protocol, with
aiohttp's websocket client: load a page, wait for its load event, run a probe script, collect
console errors, uncaught exceptions and browser log errors, take a full-page screenshot.

    python -m tests.loadtests.chromium runs/demo-X/report.html --screenshot shot.png

Every run uses a fresh profile in a temp dir; DevTools listens on 127.0.0.1 only (a port the
browser picks and writes into the profile), and the flags switch off every background fetch.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from loadtests.procs import stop_process

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--remote-debugging-port=0")
WIDTH = 1200
CALL_TIMEOUT_S = 60.0


@dataclass
class PageResult:
    value: Any                                       # what the probe script returned
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, log errors
    screenshot: bytes | None = None                  # PNG, the whole page at WIDTH css px


class _Session:
    """One CDP connection: numbered calls answered by id, events kept in order."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.events: list[dict] = []
        self._next = 0
        self._pending: dict[int, asyncio.Future] = {}
        self._waiting: dict[str, asyncio.Future] = {}
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for msg in self.ws:
            data = json.loads(msg.data)
            if "id" in data:
                self._pending.pop(data["id"]).set_result(data)
                continue
            self.events.append(data)
            fut = self._waiting.pop(data.get("method", ""), None)
            if fut is not None and not fut.done():
                fut.set_result(data)

    def expect(self, method: str) -> asyncio.Future:
        """A future for the next event `method` (ask before the call that causes it)."""
        fut = asyncio.get_running_loop().create_future()
        self._waiting[method] = fut
        return fut

    async def call(self, method: str, **params: Any) -> dict:
        self._next += 1
        fut = asyncio.get_running_loop().create_future()
        self._pending[self._next] = fut
        await self.ws.send_json({"id": self._next, "method": method, "params": params})
        data = await asyncio.wait_for(fut, CALL_TIMEOUT_S)  # a crashed browser never answers
        if "error" in data:
            raise RuntimeError(f"{method}: {data['error']}")
        return data["result"]

    def errors(self) -> list[str]:
        out = []
        for ev in self.events:
            p = ev.get("params", {})
            if ev["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append("exception: " + d.get("exception", {}).get("description", d["text"]))
            elif ev["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert"):
                out.append(f"console.{p['type']}: " + " ".join(
                    str(a.get("value", a.get("description", ""))) for a in p["args"]))
            elif ev["method"] == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"log ({p['entry']['source']}): {p['entry']['text']}")
        return out

    async def close(self) -> None:
        self._reader.cancel()


def _devtools_port(profile: Path, proc: subprocess.Popen, timeout_s: float) -> int:
    """The browser writes the port it picked into DevToolsActivePort once it listens."""
    path = profile / "DevToolsActivePort"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with {proc.returncode}")
        if path.is_file():
            lines = path.read_text().split()
            if lines:
                return int(lines[0])
        time.sleep(0.1)
    raise RuntimeError(f"chromium opened no DevTools port within {timeout_s}s")


async def _drive(port: int, url: str, probe: str, screenshot: bool, timeout_s: float
                 ) -> PageResult:
    async with aiohttp.ClientSession() as http:
        async with http.get(f"http://127.0.0.1:{port}/json/list") as r:
            page = next(t for t in await r.json() if t["type"] == "page")
        async with http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0) as ws:
            cdp = _Session(ws)
            try:
                for domain in ("Runtime", "Log", "Page"):
                    await cdp.call(f"{domain}.enable")
                await cdp.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=800,
                               deviceScaleFactor=1, mobile=False)
                loaded = cdp.expect("Page.loadEventFired")
                nav = await cdp.call("Page.navigate", url=url)
                if nav.get("errorText"):
                    raise RuntimeError(f"navigation to {url} failed: {nav['errorText']}")
                await asyncio.wait_for(loaded, timeout_s)
                res = await cdp.call("Runtime.evaluate", expression=probe, awaitPromise=True,
                                     returnByValue=True)
                if "exceptionDetails" in res:
                    raise RuntimeError(f"the probe script failed: {res['exceptionDetails']}")
                shot = None
                if screenshot:
                    size = (await cdp.call("Page.getLayoutMetrics"))["cssContentSize"]
                    clip = {"x": 0, "y": 0, "width": WIDTH, "height": size["height"], "scale": 1}
                    data = await cdp.call("Page.captureScreenshot", format="png", clip=clip,
                                          captureBeyondViewport=True)
                    shot = base64.b64decode(data["data"])
                await asyncio.sleep(0.2)  # late console messages of the last task
                return PageResult(res["result"].get("value"), cdp.errors(), shot)
            finally:
                await cdp.close()


def binary() -> str:
    path = shutil.which("chromium")
    if path is None:
        raise FileNotFoundError("chromium is missing: bash tests/system-packages.sh installs it "
                                "(`make test` does)")
    return path


def open_page(url: str, probe: str = "document.title", screenshot: bool = False,
              timeout_s: float = 60.0) -> PageResult:
    """Load `url` in a fresh headless Chromium and run `probe` (an expression; a promise is
    awaited) once the page's load event fired."""
    # The profile may still be written to while the helper processes exit: cleanup errors of
    # the temp dir are not the page's errors.
    with tempfile.TemporaryDirectory(prefix="chromium-", ignore_cleanup_errors=True) as tmp:
        profile = Path(tmp)
        # Its own process group: the renderer, GPU and zygote helpers go down with it.
        proc = subprocess.Popen([binary(), *FLAGS, f"--user-data-dir={profile}", "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        try:
            port = _devtools_port(profile, proc, timeout_s)
            return asyncio.run(_drive(port, url, probe, screenshot, timeout_s))
        finally:
            stop_process(proc, grace_s=5)
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # every helper had already exited
                pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Open a page in headless Chromium; print its console "
                                            "errors; optionally save a full-page screenshot.")
    p.add_argument("page", help="an HTML file or a URL")
    p.add_argument("--screenshot", help="PNG path")
    a = p.parse_args(argv)
    url = a.page if "://" in a.page else Path(a.page).resolve().as_uri()
    res = open_page(url, screenshot=bool(a.screenshot))
    if a.screenshot and res.screenshot:
        Path(a.screenshot).write_bytes(res.screenshot)
    for e in res.errors:
        print(e, file=sys.stderr)
    return 1 if res.errors else 0


if __name__ == "__main__":
    raise SystemExit(main())
