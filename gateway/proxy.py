"""The proxy handler: auth -> validate -> route -> open upstream -> relay -> record.

One function serves /v1/chat/completions and /v1/completions, streaming or not.
"""
from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from gateway import state
from gateway.auth import presented_key, require_model
from gateway.errors import BadRequest, GatewayError, PayloadTooLarge, RequestTimeout
from gateway.limits import Ticket
from gateway.metrics import NO_PROVIDER, UNKNOWN, Series
from gateway.record import RequestRecord
from gateway.relay import ClientGone, relay
from gateway.router import Route
from gateway.upstream import Opened, forward_headers, open_upstream
from gateway.validate import parse_body

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MAX_MODEL_CHARS = 256
# After [DONE] the upstream's body end is normally in the same packet; waiting longer for it
# keeps the connection reusable, and happens after the request was recorded.
_BODY_END_WAIT_S = 1.0


async def _read_body(request: web.Request, endpoint: str) -> dict[str, Any]:
    try:
        async with asyncio.timeout(request.app[state.CONFIG].server.body_timeout_seconds):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"Request body is larger than {request.client_max_size} "
                              "bytes.") from None
    except TimeoutError:
        raise RequestTimeout("The request body was not received in time.") from None
    except ConnectionError:  # the client left while sending its body
        raise ClientGone() from None
    except (web.RequestPayloadError, HttpProcessingError):  # e.g. Content-Encoding: gzip
        # on a body that is not gzip, or a chunked body that breaks its framing
        raise BadRequest("Request body cannot be decoded as its Content-Encoding says.",
                         code="bad_content_encoding") from None
    body = parse_body(raw)
    if not isinstance(body, dict):
        raise BadRequest("Request body must be a JSON object.")
    if not isinstance(body.get("model"), str) or not body["model"]:
        raise BadRequest("'model' is required and must be a string.", param="model")
    if len(body["model"]) > MAX_MODEL_CHARS:  # it is echoed in errors and logged: bound it
        raise BadRequest(f"'model' is longer than {MAX_MODEL_CHARS} characters.",
                         param="model")
    if endpoint == CHAT:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
            raise BadRequest("'messages' must be a non-empty array of objects.",
                             param="messages")
    elif not isinstance(body.get("prompt"), (str, list)):
        raise BadRequest("'prompt' is required (a string or an array).", param="prompt")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("'stream' must be a boolean.", param="stream")
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        raise BadRequest("'stream_options' must be an object.", param="stream_options")
    return body


def _prepare_body(body: dict[str, Any], route: Route) -> tuple[bool, bool]:
    """Apply alias defaults; ask the upstream for usage. Returns (stream, strip_usage)."""
    for k, v in route.defaults.items():
        body.setdefault(k, v)
    stream = bool(body.get("stream"))
    if not stream:
        return False, False
    so = body.get("stream_options") or {}
    if so.get("include_usage"):
        return True, False
    # Usage gives the true completion_tokens for TPOT; the client did not ask, so we strip it.
    body["stream_options"] = {**so, "include_usage": True}
    return True, True


async def proxy(request: web.Request, endpoint: str) -> web.StreamResponse:
    app = request.app
    rec = RequestRecord(request_id=request[state.REQUEST_ID], endpoint=endpoint,
                        t0_ns=request.get(state.T0, time.perf_counter_ns()))
    labels = [UNKNOWN, NO_PROVIDER]
    series: Series | None = None
    opened: Opened | None = None
    ticket: Ticket | None = None
    try:
        key = app[state.KEYS].check(presented_key(request))
        rec.key_name = key.name
        body = await _read_body(request, endpoint)
        rec.model = body["model"]
        router = app[state.ROUTER]
        route = router.resolve(rec.model)
        require_model(key, rec.model)
        ticket = await app[state.LIMITER].admit(key.name)
        decision = router.decide(route)
        order = decision.order
        labels = [route.label, order[0].provider.name]
        series = app[state.METRICS].series(*labels)
        series.in_flight.inc()
        rec.stream, strip_usage = _prepare_body(body, route)
        headers = forward_headers(request.headers, rec.request_id)
        opened = await open_upstream(app[state.POOL], order, endpoint, body, headers, rec,
                                     series, app[state.CONFIG].retry)
        labels[1] = opened.deployment.provider.name
        router.opened(route, decision, opened.deployment, rec)
        series_used = app[state.METRICS].series(*labels)
        resp = await relay(request, opened, rec, series_used, strip_usage)
        if rec.t_end_ns is None:
            rec.t_end_ns = time.perf_counter_ns()
        return resp
    except GatewayError as exc:
        rec.status, rec.error = exc.status, f"{exc.code}: {exc.message}"
        raise
    except asyncio.CancelledError:
        if rec.status != 200:  # a client leaving after the whole answer is no disconnect
            rec.status, rec.error = 499, "client_disconnected"
        raise
    except ClientGone:  # left before the response started: nobody to answer
        rec.status, rec.error = 499, "client_disconnected"
        return web.Response(status=499)
    except Exception as exc:
        rec.status, rec.error = 500, f"internal_error: {type(exc).__name__}"
        raise
    finally:
        if opened is not None:
            app[state.ROUTER].finished(route, opened.deployment, rec)
            opened.deployment.in_flight -= 1
            if rec.status == 200:
                opened.response.release_after_body(_BODY_END_WAIT_S)
            else:  # closing the connection tells the upstream to stop generating now
                opened.response.close()
        if series is not None:
            series.in_flight.dec()
        _finish(app, rec, labels[0], labels[1])
        if ticket is not None:
            app[state.LIMITER].release(ticket, (rec.prompt_tokens or 0) +
                                       (rec.completion_tokens or 0))


def _finish(app: web.Application, rec: RequestRecord, model: str, provider: str) -> None:
    metrics = app[state.METRICS]
    metrics.count_request(model, provider, rec.status or 500)
    if rec.stream and rec.completion_tokens is None and rec.content_chunks:
        rec.completion_tokens, rec.tokens_estimated = rec.content_chunks, True
    if rec.status == 200:
        s = metrics.series(model, provider)
        for hist, ns in ((s.ttft, rec.ttft_ns()), (s.tpot, rec.tpot_ns()),
                         (s.e2e, rec.e2e_ns()), (s.overhead, rec.overhead_ns()),
                         (s.ttfb, rec.ttfb_ns())):
            if ns is not None:
                hist.observe(ns / 1e9)
        if rec.prompt_tokens:
            s.prompt_tokens.inc(rec.prompt_tokens)
        if rec.completion_tokens:
            s.completion_tokens.inc(rec.completion_tokens)
    app[state.REQUEST_LOG].write(rec.to_log())
