"""The one relay path: upstream 200 response -> client, for chat and completions, SSE and JSON.

SSE events are relayed as they arrive, no buffering: what one upstream read completes leaves
in one client ``write``, and TTFT/ITL/TPOT are stamped when that write returns. Framing and the
content-bearing rule come from ``openai_stream`` (the same ones the load tester uses); an event
is complete at its blank line (the SSE spec), so that is when a content event counts. After the
first byte went to the client an upstream failure can no longer be retried: the stream ends
with an OpenAI-style error event and no ``[DONE]``.
"""
from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web

from gateway.errors import BadGateway, GatewayError, GatewayTimeout
from gateway.httpclient import HIGH_WATER, UpstreamError
from gateway.record import RequestRecord
from gateway.upstream import Opened
from openai_stream import SSEError, SSEFramer, finish_reason_of, has_content, is_done, usage_of

log = logging.getLogger("gateway.relay")
# The C scanner json.loads itself ends in; it keeps no state between calls.
_SCAN = json.JSONDecoder().scan_once
SSE_HEADERS = {"Content-Type": "text/event-stream; charset=utf-8",
               "Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class ClientGone(Exception):
    """The client closed its connection while we were writing to it."""


def _note_usage(rec: RequestRecord, obj: dict) -> None:
    prompt, completion = usage_of(obj)
    if prompt is not None:
        rec.prompt_tokens = prompt
    if completion is not None:
        rec.completion_tokens = completion


def _note_finish(rec: RequestRecord, choices: Any) -> None:
    reason = finish_reason_of(choices)
    if reason:
        rec.finish_reason = reason


async def relay(request: web.Request, opened: Opened, rec: RequestRecord, series: Any,
                strip_usage: bool) -> web.StreamResponse:
    """Relay an opened upstream response to the client; fills ``rec``; returns the response."""
    upstream = opened.response
    if not upstream.content_type.startswith("text/event-stream"):
        return await _relay_json(opened, rec)
    resp = web.StreamResponse(headers={**SSE_HEADERS, "x-request-id": rec.request_id})
    name = opened.deployment.provider.name
    try:
        await _write(resp.prepare, request)  # the headers can meet a connection just closed
        try:
            await _pump(resp, opened, rec, series, strip_usage)
        except TimeoutError:
            what = "first token" if rec.t_first_ns is None else "complete response"
            await _fail(resp, rec, series, GatewayTimeout(
                f"Provider {name!r} did not send the {what} in time."))
        except (UpstreamError, ValueError, RecursionError) as exc:  # bad or too deep JSON
            why = str(exc) if isinstance(exc, (UpstreamError, SSEError)) else "malformed SSE data"
            await _fail(resp, rec, series, BadGateway(
                f"Upstream stream from provider {name!r} broke ({why}).",
                code="upstream_stream_error"))
    except ClientGone:
        rec.status, rec.error = 499, "client_disconnected"
        rec.t_end_ns = time.perf_counter_ns()
    return resp


def _logged(rec: RequestRecord, err: GatewayError) -> GatewayError:
    """One log line for an upstream that failed after answering 200: no body, no key."""
    log.warning("upstream response failed: provider=%s status=%d code=%s request=%s",
                rec.provider, err.status, err.code, rec.request_id)
    return err


async def _fail(resp: web.StreamResponse, rec: RequestRecord, series: Any,
                err: GatewayError) -> None:
    """End a started stream with an error event and no [DONE]; the request counts as failed."""
    rec.status, rec.error = err.status, f"{err.code}: {err.message}"
    series.errors.inc()
    _logged(rec, err)
    await _write(resp.write_eof, err.sse())  # the error event and the body's end, one send
    rec.t_end_ns = time.perf_counter_ns()


def _loads(payload: bytes) -> Any:
    """``json.loads(payload)``, minus its Python-level wrappers (encoding sniffing, decode
    and trailing-data checks cost as much as the C scan itself) for the usual UTF-8 object."""
    if payload[:2] == b'{"':  # json.loads would pick UTF-8 for this start too
        try:
            text = payload.decode("utf-8", "surrogatepass")
            obj, end = _SCAN(text, 0)
            if end == len(text):  # payload is stripped: nothing may follow the object
                return obj
        except (ValueError, StopIteration):
            pass
    return json.loads(payload)  # the general case, and the exact error for bad input


def _event(rec: RequestRecord, payload: bytes, strip_usage: bool) -> tuple[bytes | None, bool]:
    """One ``data:`` payload -> (the event to send, or None to drop it; content-bearing?)."""
    obj = _loads(payload)  # ValueError -> malformed SSE
    if not isinstance(obj, dict):
        raise ValueError("SSE data is not a JSON object")
    if "error" in obj:  # the upstream reported a failure inside the stream
        raise UpstreamError("upstream error event")
    choices = obj.get("choices")
    if "usage" in obj:
        _note_usage(rec, obj)
        if strip_usage:  # the client did not ask for usage: we injected it
            if not choices:
                return None, False
            del obj["usage"]
            payload = json.dumps(obj, separators=(",", ":")).encode()
    _note_finish(rec, choices)
    if b"\n" in payload:  # a multi-line event (pretty-printed JSON) stays one event
        payload = payload.replace(b"\n", b"\ndata: ")
    return b"data: " + payload + b"\n\n", has_content(choices)


async def _pump(resp: web.StreamResponse, opened: Opened, rec: RequestRecord, series: Any,
                strip_usage: bool) -> None:
    # One readany() per arrival; everything relayable from it leaves in ONE write (one send
    # syscall: a stream's finish chunk, usage and [DONE] often arrive together).
    readany = opened.response.readany
    clock = time.perf_counter_ns
    itl = series.itl
    sse = SSEFramer(HIGH_WATER)
    done = False
    async with asyncio.timeout_at(opened.first_deadline) as deadline:
        while not done:
            data = await readany()
            t_read = clock()
            out: list[bytes] = []
            contents = 0
            for payload, line in (sse.feed(data) if data else sse.end()):
                if payload is None:
                    out.append(line)
                elif is_done(payload):
                    done = True
                    break
                else:
                    event, content = _event(rec, payload, strip_usage)
                    if event is not None:
                        out.append(event)
                        contents += content
            if done or not data:
                break
            if out:
                # Content is stamped as it is handed to the socket, not when the write call
                # returns: the client (another process) may read it before this task
                # resumes, and the gateway's TTFT must not end after the client's.
                t_sent = clock()
                await _write(resp.write, b"".join(out))
                rec.relay_ns += clock() - t_read
                if _contents_written(rec, contents, t_read, t_sent, itl):
                    deadline.reschedule(opened.total_deadline)
    if not done and rec.finish_reason is None:
        raise UpstreamError("upstream stream ended before completion")
    # The upstream's [DONE] (or ours, when it finished cleanly without one: clients expect
    # it) leaves with the end of the chunked body, in one send.
    out.append(b"data: [DONE]\n\n")
    t_sent = clock()
    await _write(resp.write_eof, b"".join(out))
    rec.t_end_ns = clock()
    _contents_written(rec, contents, t_read, t_sent, itl)  # content read with [DONE]
    # The client has the whole stream: the request is a success whatever happens next (the
    # upstream's body end may still be on its way; the caller lets the pool wait for it).
    rec.status = 200


def _contents_written(rec: RequestRecord, n: int, t_read: int, t_sent: int,
                      itl: Any) -> bool:
    """Note ``n`` content events that left in one write; True if the stream's first was one."""
    first = n > 0 and rec.t_first_ns is None
    for _ in range(n):
        gap = rec.content(t_read, t_sent)
        if gap is not None:  # None for the stream's first content
            itl.observe(gap / 1e9)
    return first


async def _write(write: Any, data: Any) -> None:
    try:
        await write(data)
    except ConnectionError:  # aiohttp's ClientConnectionResetError is one
        raise ClientGone() from None


async def _relay_json(opened: Opened, rec: RequestRecord) -> web.Response:
    """Non-stream answer: one JSON body, relayed unchanged (TTFT is not observable here)."""
    try:
        async with asyncio.timeout_at(opened.total_deadline):
            raw = await opened.response.read()
    except TimeoutError:
        raise _logged(rec, GatewayTimeout(f"Provider {opened.deployment.provider.name!r} did "
                                          "not answer in time.")) from None
    except UpstreamError as exc:
        raise _logged(rec, BadGateway(f"Upstream body from provider "
                                      f"{opened.deployment.provider.name!r} broke ({exc}).",
                                      code="upstream_stream_error")) from None
    t_read = time.perf_counter_ns()
    try:
        obj = json.loads(raw)
    except (ValueError, RecursionError):
        raise _logged(rec, BadGateway("Upstream sent invalid JSON.",
                                      code="upstream_bad_json")) from None
    if isinstance(obj, dict):
        _note_usage(rec, obj)
        _note_finish(rec, obj.get("choices"))
    resp = web.Response(body=raw, content_type="application/json",
                        headers={"x-request-id": rec.request_id})
    rec.relay_ns += time.perf_counter_ns() - t_read
    rec.status = 200
    return resp
