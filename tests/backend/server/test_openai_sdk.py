"""The official openai SDK (sync and async, stream and not) against the real server + engine."""
from __future__ import annotations

import asyncio
import time

import aiohttp
import httpx
import openai
import pytest

from backend.engine import model_runner
from backend.layers import cpu_int8_rows, cpu_paged_decode
from backend.layers.linear import ONE_ROW_AOT_KERNEL

from .conftest import real_server
from .test_server_fake import BAD, TIMING_KEYS, _post, _scrape

# Germany, not France: bf16's first answer token to France sits at a one-step tie ('The'
# 25.35 against 'L' 25.25 in float32), which the matmul path of a prompt's rows (packed
# kernel or dense copy, with or without a cached prefix) can flip
QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=180)


def _async_client(sdk_client, server) -> openai.AsyncOpenAI:
    return sdk_client(f"{server.base_url}/v1", timeout=180)


def _sane(timings: dict, usage: object) -> None:
    assert set(timings) == TIMING_KEYS
    assert timings["prompt_tokens"] == usage.prompt_tokens
    assert 0 <= timings["cached_prompt_tokens"] <= usage.prompt_tokens
    assert min(timings[k] for k in TIMING_KEYS) >= 0
    assert timings["tokenize_s"] <= timings["first_token_s"] <= timings["e2e_s"] < 120
    assert timings["queue_s"] + timings["prefill_s"] <= timings["first_token_s"] + 1e-3
    assert timings["decode_s"] <= timings["e2e_s"]


def test_sync_non_stream_says_berlin(smollm2):
    client = _client(smollm2)
    model = client.models.list().data[0].id
    assert model == "smollm2-135m-instruct"
    resp = client.chat.completions.create(model=model, messages=QUESTION, temperature=0,
                                          max_tokens=24, extra_headers={"x-request-id": "q1"})
    assert "Berlin" in resp.choices[0].message.content
    assert resp.id == "chatcmpl-q1" and resp.choices[0].finish_reason in ("stop", "length")
    u = resp.usage
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens and u.completion_tokens >= 2
    with httpx.Client(timeout=60) as http:
        count = http.post(f"{smollm2.base_url}/tokenize", json={"messages": QUESTION}).json()
    assert count["count"] == u.prompt_tokens == len(count["tokens"])
    _sane(resp.model_extra["firsttoken_timings"], u)


def test_the_embedded_model_runs_the_kernels_make_model_built(smollm2):
    """`make model` compiles the int8 LM head's one-row GEMV, the layer pieces for steps
    of one and of 2-8 rows and (on CPUs with AVX-512F) the paged decode attention for this
    machine; the server on the embedded model loads them (the answers above come through
    them)."""
    with httpx.Client(timeout=60) as http:
        health = http.get(f"{smollm2.base_url}/health").json()
    aot = health["cpu_aot_kernels"]
    decode = aot["decode_attention"]
    if cpu_paged_decode.why_not_here() is None:
        assert decode["status"] == "loaded", f"{decode}: `make model` builds it"
        assert decode["path"].endswith(".so")
    else:
        assert decode["status"] == "not used" and decode["reason"]
    for key in ("layers", "few_rows_layers"):
        if health["weights_dtype"].startswith(("int4", "int8")):
            assert aot[key]["status"] == "loaded", f"{aot[key]}: `make model` builds it"
        else:  # a CPU where auto keeps dense layers
            assert aot[key]["status"] == "not used"
    if health["lm_head_dtype"] != "int8":  # a CPU where auto keeps a dense head
        assert aot["lm_head"] == "not used"
        return
    assert aot["lm_head"] == "loaded", f"{aot}: `make model` builds it"
    if model_runner.int8_head_rows_kernel():  # no AVX-512: every call on our kernel
        assert health["lm_head_kernel"] == cpu_int8_rows.KERNEL_NAME
        assert aot["path"].endswith(".so") and aot["mode"] == "auto"
        return
    assert health["lm_head_kernel"] == ONE_ROW_AOT_KERNEL
    assert aot["path"].endswith(".pt2") and aot["mode"] == "auto"


def test_sync_stream_chunks_and_usage(smollm2):
    stream = _client(smollm2).chat.completions.create(
        model="smollm2-135m-instruct", messages=QUESTION, temperature=0, max_tokens=24,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    role, *content, finish, usage = chunks
    assert role.choices[0].delta.role == "assistant" and not role.choices[0].delta.content
    assert all(c.choices[0].delta.content and c.choices[0].finish_reason is None
               for c in content)
    text = "".join(c.choices[0].delta.content for c in content)
    assert "Berlin" in text
    assert finish.choices[0].finish_reason in ("stop", "length")
    assert finish.choices[0].delta.content is None and finish.usage is None
    assert usage.choices == [] and usage.usage.completion_tokens >= len(content)
    assert all("firsttoken_timings" not in (c.model_extra or {}) for c in chunks[:-1])
    _sane(usage.model_extra["firsttoken_timings"], usage.usage)


async def test_async_completions_stream_and_not(smollm2, sdk_client):
    client = _async_client(sdk_client, smollm2)
    prompt = "The capital of Germany is"
    resp = await client.completions.create(model="smollm2-135m-instruct", prompt=prompt,
                                           temperature=0, max_tokens=8)
    assert "Berlin" in resp.choices[0].text and resp.choices[0].finish_reason == "length"
    assert resp.usage.completion_tokens == 8
    _sane(resp.model_extra["firsttoken_timings"], resp.usage)
    stream = await client.completions.create(model="smollm2-135m-instruct", prompt=prompt,
                                             temperature=0, max_tokens=8, stream=True)
    chunks = [c async for c in stream]
    assert "".join(c.choices[0].text for c in chunks) == resp.choices[0].text  # greedy
    assert chunks[-1].choices[0].finish_reason == "length"
    assert "firsttoken_timings" in chunks[-1].model_extra


async def test_async_chat_with_stop_string(smollm2, sdk_client):
    client = _async_client(sdk_client, smollm2)
    stream = await client.chat.completions.create(
        model="smollm2-135m-instruct", messages=QUESTION, temperature=0, max_tokens=24,
        stop=["Berlin"], stream=True)
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Berlin" not in text and "capital" in text
    assert chunks[-1].choices[0].finish_reason == "stop"
    await _wait_idle(smollm2)


def test_sdk_raises_openai_errors(smollm2):
    client = _client(smollm2)
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert err.value.body["param"] == "model"
    for extra in ({"n": 2}, {"temperature": -1}, {"top_p": 2}, {"max_tokens": 0}):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="smollm2-135m-instruct", messages=QUESTION,
                                           **extra)
        assert err.value.body["param"] in {*extra, "max_tokens"}
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="smollm2-135m-instruct", prompt="hi " * 3000)
    assert "2048" in err.value.message and "3001" in err.value.message


@pytest.mark.parametrize("path,body,status,param", BAD)
async def test_every_bad_input_on_the_real_engine(tiny, path, body, status, param):
    if isinstance(body, dict) and body.get("model") == "fake-model":
        body = {**body, "model": "synthetic:tiny"}
    code, _, out = await _post(tiny.base_url + path, body)
    assert code == status and out["error"]["param"] == param, out


async def test_prompt_longer_than_context_names_both_lengths(tiny):
    code, _, out = await _post(f"{tiny.base_url}/v1/completions",
                               {"model": "synthetic:tiny", "prompt": "x" * 600})
    assert code == 400 and "512" in out["error"]["message"] and "600" in out["error"]["message"]


async def test_seeded_sampling_is_reproducible_through_http(tiny, sdk_client):
    client = _async_client(sdk_client, tiny)

    async def sample(seed: int) -> str:
        r = await client.completions.create(model="synthetic:tiny", prompt="abc", seed=seed,
                                            temperature=1.0, top_p=0.9, max_tokens=12,
                                            extra_body={"ignore_eos": True, "top_k": 50})
        return r.choices[0].text

    first, again, other = await asyncio.gather(sample(7), sample(7), sample(8))
    assert first == again and first != other


async def _wait_idle(server, timeout: float = 30.0) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = server.engine_stats()
        if s.running == 0 and s.waiting == 0 and s.kv_blocks_used == 0:
            return s
        await asyncio.sleep(0.05)
    return server.engine_stats()


async def _gauges(server) -> dict:
    async with aiohttp.ClientSession() as s:
        return await _scrape(s, server.base_url)


@pytest.mark.parametrize("stream", [True, False])
async def test_disconnect_frees_blocks_on_the_real_engine(smollm2, stream):
    # 1000 forced tokens take SmolLM2 many seconds here; the client hangs up within the first.
    body = {"model": "smollm2-135m-instruct", "prompt": "Once upon a time", "max_tokens": 1000,
            "ignore_eos": True, "stream": stream}
    await _wait_idle(smollm2)
    generated = smollm2.engine_stats().generation_tokens_total
    async with aiohttp.ClientSession() as s:
        post = asyncio.ensure_future(s.post(f"{smollm2.base_url}/v1/completions", json=body))
        for _ in range(1000):  # bounded wait until the engine holds blocks for it
            if smollm2.engine_stats().kv_blocks_used:
                break
            await asyncio.sleep(0.01)
        assert (await _gauges(smollm2))["backend_requests_running"] == 1
        if stream:
            resp = await post
            await resp.content.readline()
            resp.close()
        else:
            post.cancel()
            await asyncio.gather(post, return_exceptions=True)
    stats = await _wait_idle(smollm2)
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
    assert stats.generation_tokens_total - generated < 1000  # it was cut short
    g = await _gauges(smollm2)
    assert g["backend_requests_running"] == 0 and g["backend_kv_blocks_used"] == 0


async def test_metrics_move_with_the_real_engine(tiny, sdk_client):
    before = await _gauges(tiny)
    client = _async_client(sdk_client, tiny)
    await client.chat.completions.create(model="synthetic:tiny", messages=QUESTION,
                                         max_tokens=6, extra_body={"ignore_eos": True})
    after = await _gauges(tiny)
    assert after["backend_generation_tokens_total"] - before["backend_generation_tokens_total"] == 6
    for name in ("backend_ttft_seconds_count", "backend_e2e_seconds_count",
                 "backend_batch_size_count", "backend_prompt_tokens_total"):
        assert after[name] > before[name], name
    assert after["backend_kv_blocks_total"] > 0
    assert any(k.startswith("backend_attention_kernel_info{") for k in after)
    assert after["backend_eager_steps_total"] == 0  # no CUDA graphs here: none counted


async def test_cached_prompt_tokens_are_counted(tiny, sdk_client):
    # the same long prompt twice: the second is served from the prefix cache but its last
    # partial block, and the counter moves by what its usage reports as cached
    client = _async_client(sdk_client, tiny)
    messages = [{"role": "user", "content": "count the blocks of this prompt " * 8}]
    await client.chat.completions.create(model="synthetic:tiny", messages=messages,
                                         max_tokens=1)
    before = await _gauges(tiny)
    again = await client.chat.completions.create(model="synthetic:tiny", messages=messages,
                                                 max_tokens=1)
    after = await _gauges(tiny)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached >= again.usage.prompt_tokens - 16 > 0
    assert after["backend_cached_prompt_tokens_total"] - \
        before["backend_cached_prompt_tokens_total"] == cached


async def test_full_kv_cache_makes_requests_wait(sdk_client):
    # A KV pool of a few blocks: each request below needs 3/4 of it, so they cannot all run
    # at once; the others must wait (or be preempted and recomputed) — never fail.
    server = real_server("synthetic:tiny", max_model_len=1024,
                         kv_cache_memory_gib=4 * 8192 / 2**30)
    try:
        blocks = server.engine_stats().kv_blocks_total
        assert 4 <= blocks <= 32
        capacity = blocks * 16
        max_tokens = capacity * 3 // 4 - 20
        client = _async_client(sdk_client, server)
        reqs = [client.completions.create(model="synthetic:tiny", prompt=[65 + i] * 20,
                                          max_tokens=max_tokens,
                                          extra_body={"ignore_eos": True})
                for i in range(3)]
        results = await asyncio.wait_for(asyncio.gather(*reqs), 120)
        assert [r.usage.completion_tokens for r in results] == [max_tokens] * 3
        queued = sorted(r.model_extra["firsttoken_timings"]["queue_s"] for r in results)
        # Some request was held back: it queued behind a whole other one, or was preempted.
        e2e = min(r.model_extra["firsttoken_timings"]["e2e_s"] for r in results)
        assert queued[-1] > 0.5 * e2e or server.engine_stats().preemptions_total > 0
        with pytest.raises(openai.BadRequestError) as err:
            await client.completions.create(model="synthetic:tiny", prompt="x",
                                            max_tokens=capacity)
        assert "blocks" in err.value.message
        assert (await _wait_idle(server)).kv_blocks_used == 0
    finally:
        server.stop()
