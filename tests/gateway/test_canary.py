"""Canary keys through every path: well-formed and malformed client keys (control bytes,
bytes that are not UTF-8, over-long), in each header a key may come in, and a provider key
that an upstream echoes in its error body behind JSON escapes. No byte of any response, log
line, request-log record (JSONL and CSV) or /metrics page may contain a canary, in plain text
or in a JSON-escaped form."""
from __future__ import annotations

import json
import logging
import uuid

import pytest
from yarl import URL

from benchmarks.rawhttp import exchange, request_bytes
from gateway import state
from gateway.app import create_app, start_server
from gateway.config import build_config
from loadtests.fake_upstream import FakeConfig, FakeUpstream
from tests.gateway.conftest import ENV, base_config

MSG = [{"role": "user", "content": "hi"}]


def _forms(secret: str) -> list[bytes]:
    """The secret as bytes, JSON-escaped (as json.dumps writes it), and \\u-escaped."""
    return [secret.encode("utf-8", "surrogateescape"),
            json.dumps(secret)[1:-1].encode(),
            "".join(f"\\u{ord(ch):04x}" for ch in secret).encode()]


@pytest.fixture
async def canary_gateway(tmp_path):
    upstream_key = "sk-up-" + uuid.uuid4().hex
    client_key = "sk-cl-" + uuid.uuid4().hex
    async with FakeUpstream(FakeConfig(ttft_ms=1, itl_ms=1, tokens=4)) as fake:
        doc = base_config(fake.base_url, tmp_path / "r.jsonl",
                          request_log_csv=str(tmp_path / "r.csv"))
        app = create_app(build_config(doc, env={}),
                         env={**ENV, "GW_TEST_KEY": client_key, "GW_UP_KEY": upstream_key})
        runner, url = await start_server(app)
        try:
            yield URL(url), client_key, upstream_key, tmp_path, fake, app
        finally:
            await runner.cleanup()


async def test_canaries_leak_nowhere(canary_gateway, caplog):
    caplog.set_level(logging.DEBUG)
    url, client_key, upstream_key, tmp_path, fake, app = canary_gateway
    canaries = [client_key, upstream_key]
    seen: list[bytes] = []

    async def send(headers: dict, body: dict | None = None, path="/v1/chat/completions",
                   method="POST") -> int:
        raw = json.dumps(body or {"model": "fast", "messages": MSG}).encode()
        r = await exchange(url.host, url.port, request_bytes(path, raw if method == "POST"
                                                             else b"", headers, method))
        seen.append(json.dumps(r.headers).encode() + r.body)
        assert r.status < 500 or body is not None, (headers, r.status)
        return r.status

    good = {"Authorization": f"Bearer {client_key}", "Content-Type": "application/json"}
    # The good key on every path: stream, JSON, faults, unknown model, upstream errors that
    # echo the provider key (\u-escaped: raw-text scrubbing alone would pass it on).
    fakes = [{}, {"fault": "cut"}, {"fault": "malformed"}, {"fault": "503"}, {"fault": "401"},
             {"fault": "step_failed", "echo_auth": True}, {"fault": "400", "echo_auth": True},
             {"fault": "422", "echo_auth": True}, {"fault": "429", "echo_auth": True}]
    for stream in (False, True):
        for opts in fakes:
            await send(good, {"model": "fast", "messages": MSG, "stream": stream,
                              "fake": {"ttft_ms": 0, **opts}})
    assert await send(good, {"model": "nope", "messages": MSG}) == 404
    assert await send({}, path="/metrics", method="GET") == 200
    assert await send({}, path="/readyz", method="GET") == 200
    assert await send(good, path="/v1/models", method="GET") == 200
    # Malformed keys: each a fresh canary, in each header a key may come in.
    for header, prefix in (("Authorization", b"Bearer "), ("x-api-key", b""),
                           ("api-key", b"")):
        for shape in ("ctl0", "ctl1", "del", "utf8", "long", "huge", "wrong"):
            key = "sk-bad-" + uuid.uuid4().hex
            canaries.append(key)
            value = prefix + key.encode() + {
                "ctl0": b"\x00z", "ctl1": b"\x01z", "del": b"\x7fz", "utf8": b"\xff\xfe",
                "long": b"k" * 2000, "huge": b"k" * 9000, "wrong": b""}[shape]
            status = await send({header: value, "Content-Type": "application/json"})
            assert status in (400, 401), (header, shape, status)
            status = await send({header: value}, path="/metrics", method="GET")
            assert status in (200, 400, 401), (header, shape, status)
    assert fake.stats.requests >= len(fakes)
    # The upstream got the provider key and only it.
    assert {r.headers.get("Authorization") for r in fake.received} == {f"Bearer {upstream_key}"}
    # Gather every byte the gateway produced.
    metrics = await exchange(url.host, url.port, request_bytes("/metrics", b"", {}, "GET"))
    seen.append(metrics.body)
    app[state.REQUEST_LOG].flush()
    blob = b"\n".join(seen)
    blob += caplog.text.encode("utf-8", "backslashreplace")
    blob += "\n".join(repr(r.__dict__) for r in caplog.records).encode("utf-8",
                                                                         "backslashreplace")
    blob += (tmp_path / "r.jsonl").read_bytes() + (tmp_path / "r.csv").read_bytes()
    assert b"gateway_requests_total" in blob and len((tmp_path / "r.jsonl").read_text()
                                                     .splitlines()) >= 25
    # Proof the echo faults did carry the provider key (the scrubber had work to do).
    assert b"***" in blob
    for secret in canaries:
        for form in _forms(secret):
            assert form not in blob, secret

