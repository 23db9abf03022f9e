"""A fast, fault-injecting fake OpenAI-compatible upstream (stands in for TaoToken, vLLM, ...).

Run it::

    python -m fakeupstream --host 127.0.0.1 --port 0 --ttft-ms 100 --itl-ms 10 --tokens 64

The first stdout line is ``listening http://HOST:PORT`` (flushed). Endpoints: ``POST
/v1/chat/completions``, ``POST /v1/completions`` (stream and not), ``GET /v1/models``, ``POST
/tokenize`` (``{"prompt": text}`` or ``{"messages": [...]}`` -> ``{"tokens": [...], "count": n}``,
whitespace tokens), ``GET /health``. Every path is also served without the ``/v1`` prefix.

Streaming: the role-only chunk goes out at once, the first content chunk after ``ttft_ms``, each
next one after ``itl_ms``; one token per content chunk; ``max_tokens`` caps the token count
(finish_reason ``length``, else ``stop``); a usage chunk (``choices: []``) follows when the request
has ``stream_options.include_usage``; then ``data: [DONE]``. Non-stream responses wait
``ttft_ms + (n-1)*itl_ms`` and always carry ``usage``.

Per-request control. Options come from the JSON body field ``"fake": {...}`` (what the openai SDK
sends with ``extra_body={"fake": {...}}``, and what a proxy forwards unchanged) and from request
headers ``x-fake-<option>`` (underscores become dashes, e.g. ``x-fake-ttft-ms: 5``); the body wins.

=================  =========================================================================
option             meaning
=================  =========================================================================
ttft_ms, itl_ms    delays (float ms), override the server defaults
tokens             content tokens to send (still capped by ``max_tokens``)
fault              one of: ``400`` ``401`` ``422`` ``500`` ``502`` ``503`` (JSON error),
                   ``429`` (with ``Retry-After``), ``close`` (close the connection before any header: the client sees a
                   disconnect), ``cut`` (drop the connection after ``cut_after`` content chunks,
                   no terminating chunk), ``malformed`` (a broken ``data:`` line after
                   ``cut_after`` chunks), ``stall_first`` (role chunk, then silence for
                   ``stall_s``), ``stall_mid`` (silence after ``cut_after`` chunks), ``no_usage``
                   (never send usage, even when asked), ``hang`` (read the request, then
                   silence for ``stall_s`` before any header), ``step_failed`` (HTTP 500 with
                   code ``request_failed_in_step``: the request broke an engine step)
fail_times         apply ``fault`` only to the first N requests with the same ``x-request-id``
                   (then answer normally): for retry tests
retry_after        seconds in the ``Retry-After`` header of a 429 (default 1)
cut_after          content chunks before cut/malformed/stall_mid (default 2)
stall_s            length of a stall (default 3600)
keepalive          number of empty-content chunks (``delta: {"content": ""}``) and SSE comment
                   lines (``: keep-alive``) sent after the role chunk, before content
no_role            true: skip the role-only chunk
reasoning          the first N tokens go out as ``delta.reasoning_content``
tool_calls         true: tokens go out as ``delta.tool_calls`` argument fragments
tail_ms            pause between ``data: [DONE]`` and the end of the body (default 0)
echo_auth          true: a JSON error fault's message quotes the ``Authorization`` header it
                   received, every character written as a ``\\uXXXX`` JSON escape
stamp              true: every content chunk carries ``fake_recv_ns`` (the request's receipt)
                   and ``fake_sent_ns`` (this chunk's send), ``time.monotonic_ns()`` values
=================  =========================================================================

Timing. The TTFT counts from the request's receipt (handler entry). By default the event loop's
timer waits (uvloop: 1 ms granularity, so ~0.5–1.2 ms late) and every next token follows the
previous one after ``itl_ms``. ``precise_timers`` (CLI ``--precise-timers``) waits on a timerfd
instead, never early: the first content finishes its wait yielding for the last ``finish_us``
(300) µs, so it leaves ~0.02 ms after its deadline; token i is then due at the first send +
i x ``itl_ms`` (no drift), rounded up to an ``itl_grid_ns`` (0.25 ms) grid to share wake-ups
(see ``fakeupstream/timing.py``). ``--loop asyncio`` runs the CLI on asyncio. ``stamp_log`` (CLI
``--stamp-log PATH``) appends one JSONL line per stream at its first content: request id,
receipt and first-send times (``StampLog``).

A connection *refusal* is a stopped server: use a port with nothing listening.

Recording (for tests): ``FakeUpstream.received`` holds the last ``record_limit`` requests as
``Received(path, headers, body)`` (headers include ``Authorization`` and ``x-request-id``);
``stats`` counts ``requests``, ``open_streams``, ``completed_streams`` and ``cancelled_streams``
(a stream whose client went away before it ended).
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import deque
from typing import Any

from aiohttp import web
from multidict import CIMultiDict

from fakeupstream.plan import (FakeConfig, Received, Stats, Plan, parse_options,
                                 prompt_tokens, sse)
from fakeupstream.timing import (PreciseTimer, StampLog, loop_sleep_until,
                                   precise_timers_available)


class FakeUpstream:
    """In-process fake upstream: ``base_url = await fake.start()``; ``await fake.stop()``."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.received: deque[Received] = deque(maxlen=self.config.record_limit)
        self.stats = Stats()
        self._runner: web.AppRunner | None = None
        self._timer: PreciseTimer | None = None
        self._stamp_log: StampLog | None = None
        self.base_url = ""

    # ---- lifecycle -------------------------------------------------------------------------
    async def __aenter__(self) -> "FakeUpstream":
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def make_app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        for prefix in ("/v1", ""):
            app.router.add_post(prefix + "/chat/completions", self._chat)
            app.router.add_post(prefix + "/completions", self._completions)
            app.router.add_get(prefix + "/models", self._models)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_get("/health", self._health)
        return app

    async def start(self) -> str:
        if self.config.precise_timers and precise_timers_available():
            self._timer = PreciseTimer(self.config.finish_us)  # on the serving loop
        if self.config.stamp_log:
            self._stamp_log = StampLog(self.config.stamp_log)
        # handler_cancellation: a client that goes away during a stall cancels the handler,
        # so tests can count cancelled streams.
        self._runner = web.AppRunner(self.make_app(), handler_cancellation=True,
                                     access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port, backlog=4096)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://{self.config.host}:{port}"
        return self.base_url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._timer is not None:
            self._timer.close()
            self._timer = None
        if self._stamp_log is not None:
            self._stamp_log.close()
            self._stamp_log = None

    @property
    def precise(self) -> bool:
        """Whether delays use the timerfd (``precise_timers`` asked and available)."""
        return self._timer is not None

    async def _sleep_until(self, deadline_ns: int, finish: bool = False,
                           grid_ns: int = 0) -> None:
        if self._timer is not None:
            await self._timer.sleep_until(deadline_ns, finish, grid_ns)
        else:
            await loop_sleep_until(deadline_ns)

    def last(self, path_suffix: str = "") -> Received:
        for r in reversed(self.received):
            if r.path.endswith(path_suffix):
                return r
        raise LookupError(f"no request to *{path_suffix} recorded")

    # ---- plan ------------------------------------------------------------------------------
    def _plan(self, request: web.Request, body: dict) -> Plan:
        try:
            o = parse_options(request.headers, body.get("fake"))
        except ValueError as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        c = self.config
        tokens = c.tokens if o.tokens is None else o.tokens
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        finish = "stop"
        if isinstance(max_tokens, int) and 0 <= max_tokens <= tokens:
            tokens, finish = max_tokens, "length"
        fault = o.fault
        if fault and o.fail_times is not None:
            rid = request.headers.get("x-request-id", "")
            seen = self.stats.attempts_by_id.get(rid, 0) + 1
            self.stats.attempts_by_id[rid] = seen
            if seen > o.fail_times:
                fault = ""
        so = body.get("stream_options")
        return Plan(
            ttft_s=(c.ttft_ms if o.ttft_ms is None else o.ttft_ms) / 1000,
            itl_s=(c.itl_ms if o.itl_ms is None else o.itl_ms) / 1000,
            tokens=tokens, finish_reason=finish, fault=fault, retry_after=o.retry_after,
            cut_after=o.cut_after, stall_s=o.stall_s, keepalive=o.keepalive, role=not o.no_role,
            reasoning=o.reasoning, tool_calls=o.tool_calls,
            include_usage=isinstance(so, dict) and bool(so.get("include_usage")),
            stamp=c.stamp if o.stamp is None else o.stamp,
            tail_s=o.tail_ms / 1000, echo_auth=o.echo_auth,
        )

    # ---- handlers --------------------------------------------------------------------------
    async def _read(self, request: web.Request) -> dict:
        self.stats.requests += 1
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            body = None
        self.received.append(Received(request.path, CIMultiDict(request.headers), body))
        if not isinstance(body, dict):
            raise web.HTTPBadRequest(text="body must be a JSON object")
        return body

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        recv_ns = time.monotonic_ns()  # the delays count from here
        body = await self._read(request)
        return await self._generate(request, body, True, recv_ns)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        recv_ns = time.monotonic_ns()
        body = await self._read(request)
        return await self._generate(request, body, False, recv_ns)

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": self.config.model, "object": "model", "created": 0, "owned_by": "fake"}]
        return web.json_response({"object": "list", "data": data})

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def _tokenize(self, request: web.Request) -> web.Response:
        body = await self._read(request)
        toks = prompt_tokens(body)
        return web.json_response({"tokens": toks, "count": len(toks)})

    async def _fault_response(self, request: web.Request, plan: Plan) -> web.Response | None:
        if plan.fault in ("400", "401", "422", "500", "502", "503", "429", "step_failed"):
            status = 500 if plan.fault == "step_failed" else int(plan.fault)
            headers = {"Retry-After": f"{plan.retry_after:g}"} if status == 429 else None
            message = f"fake upstream fault {plan.fault}"
            if plan.echo_auth:  # "\u0073\u006b..." : only a JSON decoder sees the key
                message += " " + "".join(f"\\u{ord(ch):04x}" for ch in
                                         request.headers.get("Authorization", ""))
            code = '"request_failed_in_step"' if plan.fault == "step_failed" else str(status)
            kind = "server_error" if plan.fault == "step_failed" else "fake_fault"
            text = (f'{{"error": {{"message": "{message}", "type": "{kind}", "param": null, '
                    f'"code": {code}}}}}')
            return web.Response(text=text, status=status, headers=headers,
                                content_type="application/json")
        if plan.fault == "hang":
            await asyncio.sleep(plan.stall_s)
        if plan.fault == "close":
            if request.transport is not None:
                request.transport.close()
            raise asyncio.CancelledError()  # aiohttp drops the closed connection quietly
        return None

    async def _generate(self, request: web.Request, body: dict, chat: bool,
                        recv_ns: int) -> web.StreamResponse:
        plan = self._plan(request, body)
        faulted = await self._fault_response(request, plan)
        if faulted is not None:
            return faulted
        model = str(body.get("model") or self.config.model)
        n_prompt = len(prompt_tokens(body))
        if body.get("stream"):
            return await self._stream(request, plan, model, n_prompt, chat, recv_ns)
        await self._sleep_until(recv_ns + int((plan.ttft_s + plan.itl_s * max(plan.tokens - 1, 0))
                                              * 1e9))
        text = "".join(f"t{i} " for i in range(plan.tokens))
        usage = {"prompt_tokens": n_prompt, "completion_tokens": plan.tokens,
                 "total_tokens": n_prompt + plan.tokens}
        if chat:
            choice: dict[str, Any] = {"index": 0, "finish_reason": plan.finish_reason,
                                      "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text, "finish_reason": plan.finish_reason,
                      "logprobs": None}
        out = {"id": "fake-" + uuid.uuid4().hex, "object": "chat.completion" if chat else
               "text_completion", "created": int(time.time()), "model": model,
               "choices": [choice]}
        if plan.fault != "no_usage":
            out["usage"] = usage
        return web.json_response(out)

    async def _stream(self, request: web.Request, plan: Plan, model: str, n_prompt: int,
                      chat: bool, recv_ns: int) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        self.stats.open_streams += 1
        finished = False
        try:
            await resp.prepare(request)
            await self._emit(resp, plan, model, n_prompt, chat, request, recv_ns)
            finished = True
        except (asyncio.CancelledError, ConnectionResetError):
            self.stats.cancelled_streams += 1
            raise
        finally:
            self.stats.open_streams -= 1
            if finished:
                self.stats.completed_streams += 1
        return resp

    async def _emit(self, resp: web.StreamResponse, plan: Plan, model: str, n_prompt: int,
                    chat: bool, request: web.Request, recv_ns: int) -> None:
        cid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        # Pre-split template: each content chunk is one bytes concatenation, no json.dumps.
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = (f'data: {{"id":"{cid}","object":"{obj}","created":{int(time.time())},'
                f'"model":{json.dumps(model)},"choices":[{{"index":0,').encode()
        tail = b',"finish_reason":null}]}\n\n'
        stamped = b',"finish_reason":null}],"fake_recv_ns":%d,"fake_sent_ns":' % recv_ns
        write = resp.write
        if chat and plan.role:
            await write(head + b'"delta":{"role":"assistant","content":""}' + tail)
        for _ in range(plan.keepalive):
            await write(b": keep-alive\n\n")
            await write(head + (b'"delta":{"content":""}' if chat else b'"text":""') + tail)
        due, itl_ns = recv_ns + int(plan.ttft_s * 1e9), int(plan.itl_s * 1e9)
        await self._sleep_until(due, finish=True)
        if plan.fault == "stall_first":
            await asyncio.sleep(plan.stall_s)
            due = time.monotonic_ns()
        for i in range(plan.tokens):
            if i and self._timer is None:
                await asyncio.sleep(plan.itl_s)  # default: every gap >= itl, as it always was
            elif i:
                # Precise: token i due at first send + i*itl (no drift, mean gap >= itl). They
                # share wake-ups on a grid (never early, <= grid late): one timerfd wake per
                # token would double the fake's CPU at 256 streams.
                due += itl_ns
                await self._sleep_until(due, grid_ns=self.config.itl_grid_ns)
            else:
                due = time.monotonic_ns()  # the first content goes out now
            if i == plan.cut_after and plan.fault in ("cut", "malformed", "stall_mid"):
                if plan.fault == "malformed":
                    await write(b'data: {"id": "broken", "choices": [\n\n')
                    continue
                if plan.fault == "stall_mid":
                    await asyncio.sleep(plan.stall_s)
                    due = time.monotonic_ns()
                else:  # cut: no terminating chunk, the client sees an incomplete body
                    if request.transport is not None:
                        request.transport.abort()
                    return
            piece = head + self._piece(i, plan, chat)
            if plan.stamp or (i == 0 and self._stamp_log is not None):
                sent = time.monotonic_ns()  # taken last: resp.write hands it to the socket now
                await write(piece + (stamped + b"%d}\n\n" % sent if plan.stamp else tail))
                if i == 0 and self._stamp_log is not None:  # after the send: off its path
                    self._stamp_log.write(request.headers.get("x-request-id", ""), recv_ns, sent)
            else:
                await write(piece + tail)
        fin = {"index": 0, "finish_reason": plan.finish_reason}
        fin.update({"delta": {}} if chat else {"text": ""})
        await write(sse({"id": cid, "object": obj, "created": int(time.time()), "model": model,
                          "choices": [fin]}))
        if plan.include_usage and plan.fault != "no_usage":
            usage = {"prompt_tokens": n_prompt, "completion_tokens": plan.tokens,
                     "total_tokens": n_prompt + plan.tokens}
            await write(sse({"id": cid, "object": obj, "created": int(time.time()),
                              "model": model, "choices": [], "usage": usage}))
        await write(b"data: [DONE]\n\n")
        if plan.tail_s:
            await asyncio.sleep(plan.tail_s)
        await resp.write_eof()

    @staticmethod
    def _piece(i: int, plan: Plan, chat: bool) -> bytes:
        word = f"t{i} "
        if not chat:
            return f'"text":"{word}"'.encode()
        if i < plan.reasoning:
            return f'"delta":{{"reasoning_content":"{word}"}}'.encode()
        if plan.tool_calls:
            call: dict[str, Any] = {"index": 0, "function": {"arguments": word}}
            if i == plan.reasoning:
                call.update(id="call_0", type="function")
                call["function"]["name"] = "fake_tool"
            return b'"delta":{"tool_calls":[' + json.dumps(call).encode() + b"]}"
        return f'"delta":{{"content":"{word}"}}'.encode()
