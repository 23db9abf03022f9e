"""SSE framing in the relay: events end at a blank line, multi-line data, odd upstreams.

The fake upstream always writes one-line events; these tests use a raw upstream that writes
exact bytes, so the gateway's framing (``openai_stream``, tested on its own in
tests/openai_stream) is what is checked through a real gateway.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from gateway.app import create_app, start_server
from gateway.config import build_config
from openai_stream import is_done, iter_payloads
from tests.gateway.conftest import CLIENT_KEY, ENV, base_config

MSG = [{"role": "user", "content": "hi"}]


def _chunk(content: str, finish: str | None = None) -> dict[str, Any]:
    return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}]}


# ---- through a real gateway ------------------------------------------------------------------
async def _post_through_gateway(web_server, handler, tmp_path) -> tuple[int, bytes]:
    """A gateway in front of an upstream served by ``handler``; one streaming chat request
    through it: (status, raw body). Stopping the gateway also flushes its request log."""
    import aiohttp
    up_url, _ = await web_server(handler)
    cfg = build_config(base_config(str(up_url).rstrip("/"), tmp_path / "log.jsonl"), env={})
    gw, gw_url = await start_server(create_app(cfg, env=ENV))
    try:
        async with aiohttp.ClientSession() as s:
            async with s.post(gw_url + "/v1/chat/completions",
                              json={"model": "fast", "messages": MSG, "stream": True},
                              headers={"Authorization": f"Bearer {CLIENT_KEY}"}) as r:
                return r.status, await r.read()
    finally:
        await gw.cleanup()


async def _through_gateway(web_server, parts: list[bytes | float],
                           tmp_path) -> tuple[list[str], bytes]:
    """An upstream whose SSE body is ``parts`` (bytes are written, floats are pauses in s),
    through a gateway; the client's view: content deltas (parsed as the openai SDK would) and
    the raw body."""
    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for p in parts:
            if isinstance(p, float):
                await asyncio.sleep(p)
            else:
                await resp.write(p)
        await resp.write_eof()
        return resp

    status, raw = await _post_through_gateway(web_server, handler, tmp_path)
    assert status == 200
    texts = []
    for data in iter_payloads([raw]):
        if not is_done(data):
            obj = json.loads(data)
            texts += [c["delta"].get("content", "") for c in obj.get("choices", [])]
    return texts, raw


def _last_log_row(tmp_path) -> dict[str, Any]:
    return json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1])


async def test_multi_line_event_is_relayed_as_one_event(web_server, tmp_path):
    pretty = json.dumps(_chunk("Paris"), indent=1).encode()  # JSON over many lines
    lines = b"".join(b"data: " + ln + b"\n" for ln in pretty.split(b"\n"))
    parts: list[bytes | float] = [lines + b"\n", b"data: " + json.dumps(
        _chunk("", "stop")).encode() + b"\n\n", b"data: [DONE]\n\n"]
    texts, raw = await _through_gateway(web_server, parts, tmp_path)
    assert texts[0] == "Paris"
    assert raw.endswith(b"data: [DONE]\n\n") and b"error" not in raw


async def test_ttft_counts_when_the_event_is_complete(web_server, tmp_path):
    """The data line and its blank line arrive 0.3 s apart: a client can only use the event
    once the blank line is in, so that is when the first token counts."""
    first = b"data: " + json.dumps(_chunk("Hi")).encode() + b"\n"
    parts: list[bytes | float] = [first, 0.3, b"\n", b"data: " + json.dumps(
        _chunk("", "stop")).encode() + b"\n\n", b"data: [DONE]\n\n"]
    texts, _ = await _through_gateway(web_server, parts, tmp_path)
    assert texts[0] == "Hi"
    row = _last_log_row(tmp_path)
    assert row["status"] == 200 and row["ttft_s"] >= 0.3


async def test_stream_without_done_or_final_newline_still_finishes(web_server, tmp_path):
    """An upstream that ends after its finish chunk, with no [DONE] and no trailing blank
    line: the client still gets the content, the finish and a [DONE]."""
    parts: list[bytes | float] = [b"data: " + json.dumps(_chunk("ok")).encode() + b"\n\n",
                                  b"data: " + json.dumps(_chunk("", "stop")).encode()]
    texts, raw = await _through_gateway(web_server, parts, tmp_path)
    assert texts == ["ok", ""]
    assert raw.endswith(b"data: [DONE]\n\n")
    row = _last_log_row(tmp_path)
    assert row["status"] == 200 and row["finish_reason"] == "stop"


async def test_compressed_upstream_body_is_refused(web_server, tmp_path):
    """The gateway asks for identity encoding; a gzip body anyway is a 502, never relayed."""
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Accept-Encoding", ""))
        await request.read()
        return web.Response(body=b"\x1f\x8b not really gzip", content_type="text/event-stream",
                            headers={"Content-Encoding": "gzip"})

    status, raw = await _post_through_gateway(web_server, handler, tmp_path)
    assert seen == ["identity"]
    assert status == 502 and json.loads(raw)["error"]["code"] == "upstream_bad_encoding"
