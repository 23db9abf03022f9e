"""Hostile and malformed bodies against the real server + engine: each one a 400 naming the
field (dotted path), never a 5xx, and the server keeps serving with every KV block free."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from .harness import wait_engine_idle

MODEL = "smollm2-135m-instruct"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
# ignore_eos: a sampled EOS would end a request before its 2 tokens (they are counted)
COMPLETION = {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "ignore_eos": True}


def _raw(body: dict, **replace: str) -> bytes:
    """JSON text of body with some values swapped for literal text json.dumps can't write."""
    text = json.dumps({**body, **{k: f"@{k}@" for k in replace}})
    for key, literal in replace.items():
        text = text.replace(f'"@{key}@"', literal)
    return text.encode()


DEEP = b'{"model": "m", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
CASES = [
    ("top_k 2^63", "/v1/completions", {**COMPLETION, "top_k": 2**63}, "top_k"),
    ("top_k 2^64", "/v1/completions", {**COMPLETION, "top_k": 2**64}, "top_k"),
    ("seed 2^64", "/v1/chat/completions", {**CHAT, "seed": 2**64}, "seed"),
    ("seed -2^64", "/v1/chat/completions", {**CHAT, "seed": -2**64}, "seed"),
    ("5000 digits", "/v1/chat/completions", _raw(CHAT, max_tokens="9" * 5000), "max_tokens"),
    ("max_tokens 2^40", "/v1/completions", {**COMPLETION, "max_tokens": 2**40}, "max_tokens"),
    ("min_tokens 2^63-1", "/v1/completions", {**COMPLETION, "min_tokens": 2**63 - 1},
     "min_tokens"),
    ("temperature NaN", "/v1/chat/completions", _raw(CHAT, temperature="NaN"), "temperature"),
    ("temperature Infinity", "/v1/chat/completions", _raw(CHAT, temperature="Infinity"),
     "temperature"),
    ("temperature 1e999", "/v1/chat/completions", _raw(CHAT, temperature="1e999"),
     "temperature"),
    ("temperature 3", "/v1/chat/completions", {**CHAT, "temperature": 3}, "temperature"),
    ("top_p -Infinity", "/v1/completions", _raw(COMPLETION, top_p="-Infinity"), "top_p"),
    ("penalty NaN", "/v1/completions", _raw(COMPLETION, presence_penalty="NaN"),
     "presence_penalty"),
    ("lone surrogate in content", "/v1/chat/completions",
     _raw(CHAT, messages='[{"role": "user", "content": "a\\ud800b"}]'), "messages.0.content"),
    ("lone surrogate in model", "/v1/completions", _raw(COMPLETION, model='"\\udfff"'),
     "model"),
    ("content not text", "/v1/chat/completions",
     {**CHAT, "messages": [{"role": "user", "content": "x"}, {"role": "user", "content": 5}]},
     "messages.1.content"),
    ("stop token id 2^63", "/v1/completions", {**COMPLETION, "stop_token_ids": [1, 2**63]},
     "stop_token_ids.1"),
    ("prompt id 2^64", "/v1/completions", {**COMPLETION, "prompt": [1, 2**64]}, "prompt.1"),
    ("nested 100,000 deep", "/v1/chat/completions", DEEP, None),
    ("nested 40 deep in a field", "/v1/chat/completions",
     {**CHAT, "metadata": json.loads("[" * 40 + "]" * 40)}, None),
    ("model name of 1 MB", "/v1/completions", {**COMPLETION, "model": "m" * 2**20}, "model"),
]


async def _post(session: aiohttp.ClientSession, url: str, body: object,
                headers: dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with session.post(url, data=data, headers={"Content-Type": "application/json",
                                                     **(headers or {})}) as resp:
        return resp.status, await resp.json()


async def _alive_and_empty(server) -> None:
    async with aiohttp.ClientSession() as session:
        status, out = await _post(session, f"{server.base_url}/v1/completions", COMPLETION)
        assert status == 200 and out["usage"]["completion_tokens"] == 2
    s = await wait_engine_idle(server)
    assert (s.running, s.waiting, s.kv_blocks_used) == (0, 0, 0), s


@pytest.mark.parametrize("name,path,body,param", CASES, ids=[c[0] for c in CASES])
async def test_hostile_body_is_a_400_naming_the_field(smollm2, name, path, body, param):
    async with aiohttp.ClientSession() as session:
        status, out = await _post(session, smollm2.base_url + path, body)
    assert status == 400, out
    assert set(out["error"]) == {"message", "type", "param", "code"}
    assert out["error"]["type"] == "invalid_request_error" and out["error"]["message"]
    assert out["error"]["param"] == param, out
    assert len(json.dumps(out)) < 2000  # never echoes a huge value back


async def test_server_still_serves_after_the_hostile_bodies(smollm2):
    async with aiohttp.ClientSession() as session:
        for _, path, body, _ in CASES:
            status, _ = await _post(session, smollm2.base_url + path, body)
            assert status == 400
        async with session.get(f"{smollm2.base_url}/metrics") as resp:
            metrics = await resp.text()
    assert 'backend_request_errors_total{code="invalid_value",status="400"}' in metrics
    await _alive_and_empty(smollm2)


async def test_gzip_encoding_on_a_plain_body_is_a_4xx(smollm2):
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        status, out = await _post(session, f"{smollm2.base_url}/v1/completions", COMPLETION,
                                  headers={"Content-Encoding": "gzip"})
    assert status in (400, 415), out
    assert out["error"]["type"] == "invalid_request_error"


async def _raw_request(url: str, head: bytes, body: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(head + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    return answer


@pytest.mark.parametrize("header", [b"x-request-id: \xff\xfe\x80",
                                    b"Authorization: Bearer \xff\x00k", b"x-api-key: \xc3\x28"])
async def test_non_utf8_header_bytes_never_give_a_5xx(smollm2, header, caplog):
    body = json.dumps(COMPLETION).encode()
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" \
        + header + b"\r\n"
    answer = await _raw_request(smollm2.base_url, head, body)
    status = int(answer.split(b" ", 2)[1])
    assert status in (200, 400), answer[:300]
    assert b"\xff" not in answer and b"Bearer" not in answer
    assert "Bearer" not in caplog.text and "\\xff" not in caplog.text  # no header in logs
    await _alive_and_empty(smollm2)
