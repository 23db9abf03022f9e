"""HTTP handlers: the OpenAI endpoints, /tokenize, /health, /metrics."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from .errors import FAILURE, APIError, bad_request
from .formatting import SSE_DONE, ChunkFormatter, aggregate, sse_event
from .generation import Generation
from .protocol import Kind, parse_generation, parse_messages, read_json
from .state import BackendState, request_id

log = logging.getLogger("backend.server")
STATE = web.AppKey("backend_state", BackendState)


async def _generate(request: web.Request, kind: Kind) -> web.StreamResponse:
    received = time.perf_counter_ns()
    state, rid = request.app[STATE], request_id(request)
    req = parse_generation(await read_json(request, state.config.body_timeout_s), kind)
    state.check_model(req.model)
    prompt_ids = await state.prompt_ids(req)
    params = state.sampling_params(req, len(prompt_ids))
    # The engine id is unique even when a caller reuses an x-request-id; it keeps the prefix
    # so engine-side records still join on it.
    run = Generation(state, f"{rid}-{uuid.uuid4().hex[:8]}", prompt_ids, params, req.stop,
                     received, time.perf_counter_ns())
    if req.stream:
        fmt = ChunkFormatter(kind, rid, state.model_name, req.include_usage)
        return await _stream(request, fmt, run)
    fmt = ChunkFormatter(kind, rid, state.model_name, include_usage=True)
    async with contextlib.aclosing(fmt.render(run.events())) as stream:
        chunks = [chunk async for chunk in stream]
    return web.json_response(aggregate(chunks))


async def _stream(request: web.Request, fmt: ChunkFormatter,
                  run: Generation) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                       "Cache-Control": "no-cache"})
    await resp.prepare(request)
    # The chunks are written by a task of its own: waking it for each token then resumes
    # its short stack only, not this handler's middlewares and aiohttp's request frames.
    # Cancelling the handler (client gone) cancels the awaited task too.
    if await asyncio.ensure_future(_write_events(request, resp, fmt, run)):
        await resp.write_eof()
    return resp


async def _write_events(request: web.Request, resp: web.StreamResponse, fmt: ChunkFormatter,
                        run: Generation) -> bool:
    """Write the run's chunks as SSE events; False when the client has gone."""
    # aclosing: however this ends (client gone, handler cancelled, error), the event
    # generator closes now, which aborts the engine request and frees its blocks.
    async with contextlib.aclosing(run.events()) as events:
        try:
            for chunk in fmt.start():
                await resp.write(sse_event(chunk))
            async for event in events:  # the same chunks as fmt.render, as SSE bytes
                await resp.write(fmt.frame(event))
            await resp.write(SSE_DONE)
        except APIError as err:
            # Headers are gone: report in-band (OpenAI's shape) and leave out [DONE], so a
            # failed stream never reads as a complete, shorter answer.
            request[FAILURE] = err  # counted and logged once by the failure middleware
            await resp.write(sse_event(err.body()))
        except ConnectionError:
            log.info("client disconnected from %s", request_id(request))
            return False
    return True


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def tokenize(request: web.Request) -> web.Response:
    state = request.app[STATE]
    body = await read_json(request, state.config.body_timeout_s)
    state.check_model(body.get("model"))
    add_gen = body.get("add_generation_prompt", True)
    if "messages" in body:
        ids = await state.tokenize(parse_messages(body), None, bool(add_gen))
    elif isinstance(body.get("prompt"), str):
        ids = await state.tokenize(None, body["prompt"])
    else:
        raise bad_request("send 'prompt' (a string) or 'messages' (a chat)", param="prompt",
                          code="missing_required_parameter")
    return web.json_response({"tokens": ids, "count": len(ids),
                              "max_model_len": state.engine.max_model_len})


async def models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    return web.json_response({"object": "list", "data": [{
        "id": state.model_name, "object": "model", "created": int(time.time()),
        "owned_by": "firsttoken", "root": state.config.model,
        "max_model_len": state.engine.max_model_len}]})


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    s = state.engine.stats()
    return web.json_response({
        "status": "ok", "model": state.model_name, "attention_kernel": s.attention_kernel,
        "dtype": s.dtype, "kv_cache_dtype": state.config.engine.kv_cache_dtype,
        "weights_dtype": s.weights_format, "linear_kernel": s.linear_kernel,
        "lm_head_dtype": s.lm_head_format, "lm_head_kernel": s.lm_head_kernel,
        "cpu_aot_kernels": s.cpu_aot_kernels, "one_token_kernel": s.one_token_kernel,
        "prefill_kernel": s.prefill_kernel, "prefill_dense_weights": s.prefill_dense_weights,
        "gpu_copy_rows": s.gpu_copy_rows,
        "weights_scaling": s.weights_scaling,
        "compile": s.compile,
        "kv_blocks_used": s.kv_blocks_used, "kv_blocks_total": s.kv_blocks_total,
        "kv_cache_usage": round(s.kv_blocks_used / s.kv_blocks_total, 4)
        if s.kv_blocks_total else 0.0,
        "requests_running": s.running, "requests_waiting": s.waiting,
        "max_model_len": state.engine.max_model_len,
        "device": state.config.engine.device,
        "engine": {**state.config.engine.scheduling_policy(),
                   "max_prefill_seqs": s.max_prefill_seqs,
                   "async_scheduling": s.async_scheduling, "cuda_graphs": s.cuda_graphs,
                   "decode_kernels_per_step": {str(b): n for b, n in
                                               sorted(s.decode_kernels_per_step.items())}}})


async def metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.render()
    resp = web.Response(body=body)
    resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return resp
