"""The streamed bytes: content chunks built from a per-request template are the very bytes of
the chunk dicts, a stream says what the non-stream answer says, and concurrent streams
through the real engine each get their own tokens, whole."""
from __future__ import annotations

import asyncio
import json

import aiohttp
import openai
import pytest

from backend.server.formatting import SSE_DONE, ChunkFormatter, sse_event
from backend.server.generation import Delta, Finish

TEXTS = ["x", " w510", "\x00", '"', "\\", '\\"', "\n\t\r\x1f", "é", "中文", "😀", "\ufffd",
         "</script>", "\u2028\u2029", "\x00\x00", '{"a": 1}', "data: [DONE]\n\n"]


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("include_usage", [False, True])
@pytest.mark.parametrize("model", ["synthetic:tiny", 'odd "name"\\\x00', "\x00"])
def test_content_frames_are_the_bytes_of_the_chunk_dicts(kind, include_usage, model):
    fmt = ChunkFormatter(kind, "req-1", model, include_usage)
    for text in TEXTS:
        assert fmt.frame(Delta(text)) == sse_event(fmt.delta(Delta(text))), text
    finish = Finish("stop", {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
                    {"e2e_s": 0.5})
    assert fmt.frame(finish) == b"".join(sse_event(c) for c in fmt.finish(finish))
    assert SSE_DONE == b"data: [DONE]\n\n"


async def _raw(base: str, path: str, body: dict, rid: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s:
        async with s.post(base + path, json=body, headers={"x-request-id": rid}) as r:
            return r.status, await r.read()


def _content(kind: str, choice: dict) -> str:
    return (choice["delta"].get("content") if kind == "chat" else choice["text"]) or ""


@pytest.mark.parametrize("kind", ["chat", "completion"])
async def test_stream_says_what_the_non_stream_answer_says(tiny, kind):
    path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
    prompt = {"messages": [{"role": "user", "content": 'héllo "q"\n'}]} if kind == "chat" \
        else {"prompt": "tab\there ü"}
    # seeds whose answers are not cut to nothing by a stop string at once (checked below)
    for seed in (4, 5, 6):
        body = {"model": "synthetic:tiny", "max_tokens": 40, "temperature": 1.0, "seed": seed,
                "stop": [" w3", "é"], **prompt}
        status, whole = await _raw(tiny.base_url, path, body, f"n{seed}")
        assert status == 200
        whole = json.loads(whole)
        status, raw = await _raw(tiny.base_url, path,
                                 {**body, "stream": True,
                                  "stream_options": {"include_usage": True}}, f"s{seed}")
        assert status == 200 and raw.endswith(b"\n\ndata: [DONE]\n\n")
        events = raw.split(b"\n\n")[:-2]
        chunks = []
        for event in events:
            assert event.startswith(b"data: ")
            chunk = json.loads(event[6:])
            # compact JSON, ASCII only, keys in the order sent: what json.dumps wrote
            assert event[6:] == json.dumps(chunk, separators=(",", ":")).encode()
            assert chunk["id"] == f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-s{seed}"
            chunks.append(chunk)
        text = "".join(_content(kind, c) for c in chunks[:-1] for c in c["choices"])
        answer = whole["choices"][0]
        assert text == (answer["message"]["content"] if kind == "chat" else answer["text"])
        assert chunks[-2]["choices"][0]["finish_reason"] == answer["finish_reason"]
        usage = chunks[-1]["usage"]  # the second run's prompt may come from the prefix cache
        assert {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} \
            == {k: whole["usage"][k] for k in ("prompt_tokens", "completion_tokens",
                                               "total_tokens")}
        assert len(text) > 0


async def test_concurrent_sdk_streams_each_get_their_own_tokens(tiny):
    client = openai.AsyncOpenAI(base_url=f"{tiny.base_url}/v1", api_key="unused",
                                max_retries=0, timeout=180)

    async def one(i: int) -> tuple[str, list, object]:
        stream = await client.chat.completions.create(
            model="synthetic:tiny", messages=[{"role": "user", "content": f"story {i}"}],
            max_tokens=24 + i, temperature=1.0, seed=i, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True},
            extra_headers={"x-request-id": f"c{i}"})
        return f"c{i}", [chunk async for chunk in stream], stream

    try:
        results = await asyncio.gather(*(one(i) for i in range(16)))
    finally:
        await client.close()
    for i, (rid, chunks, _) in enumerate(results):
        assert {c.id for c in chunks} == {f"chatcmpl-{rid}"}
        assert chunks[-1].usage.completion_tokens == 24 + i
        assert chunks[-2].choices[0].finish_reason == "length"
        assert "".join(c.choices[0].delta.content or "" for c in chunks[:-1]) != ""
