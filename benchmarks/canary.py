"""Canary keys through every path of the real gateway; counts where any of them shows up.

    python -m benchmarks.canary [--json PATH]

Fresh client and provider keys (uuid canaries) go through: streams and JSON answers, upstream
faults (cut, malformed SSE, 5xx, 401, a failed engine step, 400/422/429 error bodies that echo
the provider key behind ``\\u`` JSON escapes), an unknown model, /metrics, /readyz,
/v1/models; then malformed keys, each a fresh canary, in every header a key may come in
(``Authorization``, ``x-api-key``, ``api-key``): control bytes ``\\x00 \\x01 \\x7f``, bytes
that are not UTF-8, 2,000 and 9,000 characters, and a plain wrong key. Every byte the gateway
produced is then searched for every canary, as is and JSON-escaped: response heads and bodies,
every log record at DEBUG (aiohttp's included), the request log (JSONL and CSV), /metrics.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from yarl import URL

from benchmarks.rawhttp import exchange, request_bytes
from gateway import state
from gateway.app import create_app, start_server
from gateway.config import build_config
from fakeupstream import FakeConfig, FakeUpstream

MSG = [{"role": "user", "content": "hi"}]
UPSTREAM_FAULTS = [{}, {"fault": "cut"}, {"fault": "malformed"}, {"fault": "503"},
                   {"fault": "401"}, {"fault": "step_failed", "echo_auth": True},
                   {"fault": "400", "echo_auth": True}, {"fault": "422", "echo_auth": True},
                   {"fault": "429", "echo_auth": True}]
BAD_KEY_TAILS = {"ctl0": b"\x00z", "ctl1": b"\x01z", "del": b"\x7fz", "not_utf8": b"\xff\xfe",
                 "long_2000": b"k" * 2000, "long_9000": b"k" * 9000, "wrong": b""}
KEY_HEADERS = (("Authorization", b"Bearer "), ("x-api-key", b""), ("api-key", b""))


def forms(secret: str) -> list[bytes]:
    """The secret as bytes, JSON-escaped (as json.dumps writes it), and \\u-escaped."""
    return [secret.encode("utf-8", "surrogateescape"), json.dumps(secret)[1:-1].encode(),
            "".join(f"\\u{ord(ch):04x}" for ch in secret).encode()]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[bytes] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = self.format(record) + repr(record.__dict__)
        self.lines.append(text.encode("utf-8", "backslashreplace"))


async def run_canary() -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="canary-"))
    upstream_key, client_key = "sk-up-" + uuid.uuid4().hex, "sk-cl-" + uuid.uuid4().hex
    canaries = [client_key, upstream_key]
    seen: list[bytes] = []
    statuses: list[tuple[str, int]] = []
    capture = _Capture()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(capture)
    root.setLevel(logging.DEBUG)
    fake = FakeUpstream(FakeConfig(ttft_ms=1, itl_ms=1, tokens=4))
    try:
        await fake.start()
        doc = {"keys": [{"name": "canary", "env": "CANARY_KEY"}],
               "providers": {"fake": {"base_url": fake.base_url, "api_key_env": "CANARY_UP",
                                      "max_retries": 1}},
               "models": {"fast": {"provider": "fake", "model": "m"}},
               "retry": {"backoff_base_seconds": 0.01, "backoff_max_seconds": 0.02},
               "request_log": str(tmp / "r.jsonl"), "request_log_csv": str(tmp / "r.csv")}
        app = create_app(build_config(doc, env={}),
                         env={"CANARY_KEY": client_key, "CANARY_UP": upstream_key})
        runner, url_s = await start_server(app)
        url = URL(url_s)

        async def send(what: str, headers: dict, body: dict | None = None,
                       path: str = "/v1/chat/completions", method: str = "POST") -> None:
            raw = json.dumps(body or {"model": "fast", "messages": MSG}).encode()
            r = await exchange(url.host, url.port, request_bytes(
                path, raw if method == "POST" else b"", headers, method), timeout=10)
            seen.append(json.dumps(r.headers).encode() + b"\n" + r.body)
            statuses.append((what, r.status))

        good = {"Authorization": f"Bearer {client_key}", "Content-Type": "application/json"}
        for stream in (False, True):
            for opts in UPSTREAM_FAULTS:
                await send(f"upstream {opts.get('fault', 'ok')} stream={stream}", good,
                           {"model": "fast", "messages": MSG, "stream": stream,
                            "fake": {"ttft_ms": 0, **opts}})
        await send("unknown model", good, {"model": "nope", "messages": MSG})
        await send("metrics", {}, path="/metrics", method="GET")
        await send("readyz", {}, path="/readyz", method="GET")
        await send("models", good, path="/v1/models", method="GET")
        for header, prefix in KEY_HEADERS:
            for shape, tail in BAD_KEY_TAILS.items():
                for path, method in (("/v1/chat/completions", "POST"), ("/metrics", "GET"),
                                     ("/v1/models", "GET")):
                    key = "sk-bad-" + uuid.uuid4().hex
                    canaries.append(key)
                    await send(f"{header} {shape} {path}",
                               {header: prefix + key.encode() + tail,
                                "Content-Type": "application/json"}, path=path, method=method)
        provider_auth = {r.headers.get("Authorization") for r in fake.received}
        metrics = await exchange(url.host, url.port, request_bytes("/metrics", b"", {}, "GET"))
        seen.append(metrics.body)
        app[state.REQUEST_LOG].flush()
        await runner.cleanup()
    finally:
        await fake.stop()
        root.removeHandler(capture)
        root.setLevel(old_level)
    records = [(tmp / "r.jsonl").read_bytes(), (tmp / "r.csv").read_bytes()]
    sources = {"responses": b"\n".join(seen), "logs": b"\n".join(capture.lines),
               "request_log": b"\n".join(records), "metrics": metrics.body}
    hits = [f"{where}: canary {i}" for i, secret in enumerate(canaries)
            for form in forms(secret) for where, blob in sources.items() if form in blob]
    return {
        "canaries": len(canaries), "forms_each": 3, "requests": len(statuses),
        "bytes_searched": {k: len(v) for k, v in sources.items()},
        "log_records": len(capture.lines),
        "request_log_lines": len(records[0].splitlines()),
        "scrubbed_echoes": sources["responses"].count(b"***")
        + sources["request_log"].count(b"***"),
        "provider_saw_only_its_key": provider_auth == {f"Bearer {upstream_key}"},
        "server_errors_without_upstream_fault": [w for w, s in statuses
                                                 if s >= 500 and not w.startswith("upstream")],
        "hits": hits,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.canary", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", help="write the result here")
    a = p.parse_args(argv)
    result = asyncio.run(run_canary())
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if not result["hits"] else 1


if __name__ == "__main__":
    sys.exit(main())
