"""The HTTP server against a fake engine: protocol shapes, errors, stop strings, lifecycle."""
from __future__ import annotations

import asyncio
import re
import time

import aiohttp
import pytest

from .conftest import fake_server
from .fakes import REPLY
from .sse import read_events

CHAT = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}]}
TIMING_KEYS = {"tokenize_s", "queue_s", "prefill_s", "first_token_s", "decode_s", "e2e_s",
               "prompt_tokens", "cached_prompt_tokens"}


async def _post(url: str, body: object, headers: dict | None = None) -> tuple[int, object, dict]:
    async with aiohttp.ClientSession() as s:
        data = body if isinstance(body, (str, bytes)) else None
        kwargs = {"data": data} if data is not None else {"json": body}
        async with s.post(url, headers=headers, **kwargs) as r:
            return r.status, r.headers, await r.json()


async def _stream(url: str, body: dict, headers: dict | None = None) -> tuple[object, list]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url, json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            assert r.headers["Content-Type"].startswith("text/event-stream")
            return r.headers, await read_events(r)


def _check_timings(t: dict, prompt_tokens: int) -> None:
    assert set(t) == TIMING_KEYS
    assert t["prompt_tokens"] == prompt_tokens and t["cached_prompt_tokens"] == 0
    assert 0 <= t["queue_s"] and 0 <= t["prefill_s"] and 0 <= t["decode_s"]
    assert 0 < t["first_token_s"] <= t["e2e_s"] < 60
    assert t["tokenize_s"] <= t["first_token_s"]


async def _count(base: str, body: dict) -> int:
    status, _, out = await _post(f"{base}/tokenize", body)
    assert status == 200
    assert out["count"] == len(out["tokens"])
    return out["count"]


async def test_chat_stream_chunks_in_openai_order(fake):
    headers, events = await _stream(
        f"{fake.base_url}/v1/chat/completions",
        {**CHAT, "stream": True, "stream_options": {"include_usage": True}},
        headers={"x-request-id": "req-abc"})
    assert headers["x-request-id"] == "req-abc"
    assert events[-1] == "[DONE]"
    role, *content, finish, usage = events[:-1]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["object"] == "chat.completion.chunk" and role["id"] == "chatcmpl-req-abc"
    assert all(c["choices"][0]["delta"].keys() == {"content"} for c in content)
    assert all(c["choices"][0]["finish_reason"] is None and c["usage"] is None
               for c in [role, *content])
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == REPLY
    assert finish["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                    "finish_reason": "stop"}
    assert finish["usage"] is None and "firsttoken_timings" not in finish
    prompt_tokens = await _count(fake.base_url, {"messages": CHAT["messages"]})
    assert usage["choices"] == []
    assert usage["usage"]["prompt_tokens"] == prompt_tokens
    assert usage["usage"]["completion_tokens"] == len(REPLY)  # byte tokens; EOS is not output
    assert usage["usage"]["total_tokens"] == prompt_tokens + len(REPLY)
    _check_timings(usage["firsttoken_timings"], prompt_tokens)
    assert all("firsttoken_timings" not in c for c in [role, *content])


async def test_stream_without_usage_puts_timings_on_finish_chunk(fake):
    _, events = await _stream(f"{fake.base_url}/v1/chat/completions",
                              {**CHAT, "stream": True, "max_tokens": 5})
    finish = events[-2]
    assert events[-1] == "[DONE]" and "usage" not in finish
    assert finish["choices"][0]["finish_reason"] == "length"
    assert "firsttoken_timings" in finish
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[:-1]) == "Hello"


async def test_completion_stream_has_no_role_chunk(fake):
    _, events = await _stream(f"{fake.base_url}/v1/completions",
                              {"model": "fake-model", "prompt": "Say hi", "stream": True,
                               "max_tokens": 64, "stream_options": {"include_usage": True}})
    *chunks, finish, usage, done = events
    assert done == "[DONE]" and all(c["object"] == "text_completion" for c in events[:-1])
    assert "".join(c["choices"][0]["text"] for c in chunks) == REPLY
    assert all(c["choices"][0]["text"] for c in chunks)
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["choices"][0]["text"] == ""
    assert usage["usage"]["prompt_tokens"] == 6
    _check_timings(usage["firsttoken_timings"], 6)


@pytest.mark.parametrize("path,body,text", [
    ("/v1/chat/completions", CHAT, REPLY),
    ("/v1/completions", {"model": "fake-model", "prompt": "x", "max_completion_tokens": 6},
     "Hello!"),
])
async def test_non_stream_aggregates_the_stream(fake, path, body, text):
    status, headers, out = await _post(fake.base_url + path, body)
    assert status == 200 and re.fullmatch(r"[0-9a-f]{32}", headers["x-request-id"])
    choice = out["choices"][0]
    got = choice["message"]["content"] if "message" in choice else choice["text"]
    assert got == text
    assert choice["finish_reason"] == ("stop" if text == REPLY else "length")
    assert out["usage"]["completion_tokens"] == len(text)
    _check_timings(out["firsttoken_timings"], out["usage"]["prompt_tokens"])


@pytest.mark.parametrize("stop,expected", [
    ("Paris", "Hello! The capital of France is "),
    (["zzz", "capital", "The"], "Hello! "),
    ("Hello", ""),
])
async def test_stop_strings_truncate_hold_back_and_abort(fake, stop, expected):
    _, events = await _stream(f"{fake.base_url}/v1/chat/completions",
                              {**CHAT, "stream": True, "stop": stop})
    deltas = [e["choices"][0]["delta"].get("content", "") for e in events[1:-1]]
    assert "".join(deltas) == expected  # no piece of the stop string ever leaked out
    assert events[-2]["choices"][0]["finish_reason"] == "stop"
    engine = fake.state.engine
    assert fake.engine_stats().kv_blocks_used == 0 and engine.aborted


async def test_sampling_fields_reach_the_engine(fake):
    body = {**CHAT, "temperature": 0.5, "top_p": 0.9, "top_k": 7, "seed": 3, "max_tokens": 9,
            "min_tokens": 2, "ignore_eos": True, "stop_token_ids": [5, 6]}
    status, _, _ = await _post(f"{fake.base_url}/v1/chat/completions", body)
    assert status == 200
    p = fake.state.engine.seen_params[-1]
    assert (p.temperature, p.top_p, p.top_k, p.seed, p.max_tokens, p.min_tokens,
            p.ignore_eos, p.stop_token_ids) == (0.5, 0.9, 7, 3, 9, 2, True, (5, 6))


BAD = [
    ("/v1/chat/completions", "{not json", 400, None),
    ("/v1/chat/completions", "[1, 2]", 400, None),
    ("/v1/chat/completions", {"model": "fake-model"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": CHAT["messages"]}, 400, "model"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "max_completion_tokens": -1}, 400,
     "max_completion_tokens"),
    ("/v1/chat/completions", {**CHAT, "temperature": -0.1}, 400, "temperature"),
    ("/v1/chat/completions", {**CHAT, "top_p": 0}, 400, "top_p"),
    ("/v1/chat/completions", {**CHAT, "top_p": 1.5}, 400, "top_p"),
    ("/v1/chat/completions", {**CHAT, "n": 2}, 400, "n"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, 400, "temperature"),
    ("/v1/chat/completions", {**CHAT, "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {**CHAT, "stop": [1]}, 400, "stop"),
    ("/v1/completions", {"model": "fake-model"}, 400, "prompt"),
    ("/v1/completions", {"model": "fake-model", "prompt": ["a", "b"]}, 400, "prompt"),
    ("/v1/completions", {"model": "fake-model", "prompt": [1, 99999]}, 400, "prompt"),
    ("/v1/chat/completions", {**CHAT, "model": "gpt-17"}, 404, "model"),
    ("/v1/completions", {"model": "nope", "prompt": "x"}, 404, "model"),
]


@pytest.mark.parametrize("path,body,status,param", BAD)
async def test_bad_input_gets_openai_errors(fake, path, body, status, param):
    code, headers, out = await _post(fake.base_url + path, body)
    assert code == status, out
    assert set(out["error"]) == {"message", "type", "param", "code"} and out["error"]["message"]
    assert out["error"]["param"] == param and "x-request-id" in headers


async def test_context_limits_name_both_lengths(fake):
    code, _, out = await _post(f"{fake.base_url}/v1/completions",
                               {"model": "fake-model", "prompt": "x" * 300})
    assert code == 400 and out["error"]["code"] == "context_length_exceeded"
    assert "256" in out["error"]["message"] and "300" in out["error"]["message"]
    code, _, out = await _post(f"{fake.base_url}/v1/completions",
                               {"model": "fake-model", "prompt": "x" * 100, "max_tokens": 200})
    assert code == 400 and out["error"]["param"] == "max_tokens"
    assert "256" in out["error"]["message"] and "300" in out["error"]["message"]


async def test_unknown_route_is_404_in_openai_shape(fake):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{fake.base_url}/v1/nothing") as r:
            assert r.status == 404 and (await r.json())["error"]["type"] == "not_found_error"


async def test_chat_without_template_is_a_clear_400():
    server = fake_server(chat_template=False)
    try:
        code, _, out = await _post(f"{server.base_url}/v1/chat/completions", CHAT)
        assert code == 400 and out["error"]["code"] == "chat_template_missing"
        assert "chat template" in out["error"]["message"]
        assert "/v1/completions" in out["error"]["message"]
        code, _, out = await _post(f"{server.base_url}/v1/completions",
                                   {"model": "fake-model", "prompt": "hi"})
        assert code == 200 and out["choices"][0]["text"]
    finally:
        server.stop()


async def test_full_cache_waits_and_never_fit_is_400():
    # 4 blocks of 16 = 64 tokens: one request of ~60 tokens fills the cache.
    server = fake_server(blocks_total=4, token_delay_s=0.01)
    try:
        url = f"{server.base_url}/v1/completions"
        body = {"model": "fake-model", "prompt": "x" * 20, "max_tokens": 40, "ignore_eos": True}
        first = asyncio.ensure_future(_post(url, body))
        saw_waiting = False
        second = asyncio.ensure_future(_post(url, body))
        for _ in range(400):  # bounded: at most ~4 s of polling
            if server.engine_stats().waiting:
                saw_waiting = True
                break
            await asyncio.sleep(0.01)
        results = await asyncio.wait_for(asyncio.gather(first, second), 60)
        assert saw_waiting
        assert [r[0] for r in results] == [200, 200]
        assert all(r[2]["usage"]["completion_tokens"] == 40 for r in results)
        code, _, out = await _post(url, {**body, "max_tokens": 60})
        assert code == 400 and "KV blocks" in out["error"]["message"]
    finally:
        server.stop()


async def _wait_idle(server, timeout: float = 20.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = server.engine_stats()
        if s.running == 0 and s.waiting == 0 and s.kv_blocks_used == 0:
            return s
        await asyncio.sleep(0.02)
    return server.engine_stats()


@pytest.mark.parametrize("stream", [True, False])
async def test_client_disconnect_aborts_and_frees_blocks(stream):
    server = fake_server(token_delay_s=0.02)
    try:
        body = {**CHAT, "stream": stream, "max_tokens": 200, "ignore_eos": True}
        async with aiohttp.ClientSession() as s:
            # A non-stream response only starts at the end: post from a task and cancel it.
            post = asyncio.ensure_future(
                s.post(f"{server.base_url}/v1/chat/completions", json=body))
            if stream:
                resp = await post
                await resp.content.readline()  # the role chunk: the request is running
            for _ in range(200):
                if server.engine_stats().running:
                    break
                await asyncio.sleep(0.01)
            assert server.engine_stats().running == 1
            if stream:
                resp.close()  # hang up mid-stream
            else:
                post.cancel()  # hang up while waiting for the response
                with pytest.raises(asyncio.CancelledError):
                    await post
        stats = await _wait_idle(server)
        assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
        assert len(server.state.engine.aborted) == 1
    finally:
        server.stop()


async def test_tokenize_counts(fake):
    status, _, out = await _post(f"{fake.base_url}/tokenize", {"prompt": "hello"})
    assert status == 200 and out["count"] == 5 and out["tokens"] == list(b"hello")
    status, _, out = await _post(f"{fake.base_url}/tokenize", {"messages": CHAT["messages"]})
    tok = fake.state.tokenizer
    assert out["tokens"] == tok.encode(tok.apply_chat_template(CHAT["messages"]))
    assert (await _post(f"{fake.base_url}/tokenize", {"nothing": 1}))[0] == 400


async def test_models_health_and_metrics_move(fake):
    async with aiohttp.ClientSession() as s:
        async with s.get(f"{fake.base_url}/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "fake-model"
        async with s.get(f"{fake.base_url}/health") as r:
            h = await r.json()
        assert h["status"] == "ok" and h["attention_kernel"] == "fake"
        assert h["kv_blocks_total"] == 64 and h["kv_blocks_used"] == 0
        before = await _scrape(s, fake.base_url)
        assert (await _post(f"{fake.base_url}/v1/chat/completions", CHAT))[0] == 200
        after = await _scrape(s, fake.base_url)
    for name in ("backend_ttft_seconds_count", "backend_tpot_seconds_count",
                 "backend_queue_seconds_count", "backend_prefill_seconds_count",
                 "backend_e2e_seconds_count", "backend_batch_size_count"):
        assert after[name] > before.get(name, 0), name
    assert after["backend_generation_tokens_total"] == \
        before["backend_generation_tokens_total"] + len(REPLY) + 1
    assert after["backend_prompt_tokens_total"] > before["backend_prompt_tokens_total"]
    for name in ("backend_requests_running", "backend_requests_waiting",
                 "backend_kv_blocks_used", "backend_kv_blocks_total",
                 "backend_preemptions_total", 'backend_attention_kernel_info{kernel="fake"}',
                 'backend_ttft_seconds_bucket{le="0.001"}'):
        assert name in after, name


async def _scrape(session: aiohttp.ClientSession, base: str) -> dict[str, float]:
    async with session.get(f"{base}/metrics") as r:
        assert r.status == 200
        text = await r.text()
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines() if line and not line.startswith("#")}


async def test_nvtx_ranges_on_do_not_change_answers():
    server = fake_server(nvtx=True)
    try:
        assert server.state.nvtx.enabled and server.state.nvtx.prefix == "t"
        code, _, out = await _post(f"{server.base_url}/v1/chat/completions", CHAT)
        assert code == 200 and out["choices"][0]["message"]["content"] == REPLY
    finally:
        server.stop()


async def test_engine_failure_is_never_a_shorter_success():
    server = fake_server(fail_after=5)
    try:
        _, events = await _stream(f"{server.base_url}/v1/chat/completions",
                                  {**CHAT, "stream": True})
        assert "".join(e["choices"][0]["delta"].get("content", "")
                       for e in events[:-1]) == REPLY[:5]
        assert events[-1]["error"]["type"] == "server_error" and "[DONE]" not in events
        assert all(e["choices"][0]["finish_reason"] is None for e in events[:-1])
        code, _, out = await _post(f"{server.base_url}/v1/chat/completions", CHAT)
        assert code == 500 and "simulated engine failure" in out["error"]["message"]
        assert server.engine_stats().kv_blocks_used == 0
    finally:
        server.stop()


async def test_client_gone_before_the_response_is_no_server_error(caplog):
    """The client's connection ending before the response (injected: the transport error
    aiohttp raises when the headers meet a closing connection, or a body cut short) is a
    disconnect, not a server error: answered 499, logged at INFO, not counted as a
    failure, no engine request started."""
    import logging

    caplog.set_level(logging.INFO, logger="backend.server")
    server = fake_server()

    async def connection_gone(req):
        raise ConnectionResetError("Cannot write to closing transport")

    server.state.prompt_ids = connection_gone
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{server.base_url}/v1/chat/completions",
                                    json={**CHAT, "stream": True}) as r:
                assert r.status == 499
            errors = {k: v for k, v in (await _scrape(session, server.base_url)).items()
                      if k.startswith("backend_request_errors_total")}
        assert not any(errors.values()), errors
        assert [r for r in caplog.records if "disconnected" in r.getMessage()]
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        stats = await _wait_idle(server)
        assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
    finally:
        server.stop()
