"""The fake upstream: delays, faults, recording, CLI and the thread helper."""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import aiohttp
import pytest

from fakeupstream import FakeConfig, FakeUpstream, run_in_thread
from fakeupstream.timing import PreciseTimer, precise_timers_available


@pytest.fixture
async def fake():
    async with FakeUpstream(FakeConfig(ttft_ms=60, itl_ms=5, tokens=6)) as f:
        yield f


async def _events(resp: aiohttp.ClientResponse,
                  t0: float | None = None) -> list[tuple[float, str]]:
    t0 = time.perf_counter() if t0 is None else t0
    out = []
    async for line in resp.content:
        line = line.strip()
        if line.startswith(b"data: "):
            out.append((time.perf_counter() - t0, line[6:].decode()))
    return out


def _chat(**extra):
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "a b c"}],
            "stream_options": {"include_usage": True}}
    body.update(extra)
    return body


async def test_stream_shape_and_delays(fake):
    async with aiohttp.ClientSession() as s:
        async with s.post(fake.base_url + "/v1/chat/completions", json=_chat(max_tokens=4),
                          headers={"x-request-id": "rid-1", "Authorization": "Bearer up"}) as r:
            ev = await _events(r)
    assert ev[-1][1] == "[DONE]"
    chunks = [json.loads(d) for _, d in ev[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    contents = [c["choices"][0]["delta"].get("content") for c in chunks[1:5]]
    assert contents == ["t0 ", "t1 ", "t2 ", "t3 "]
    assert chunks[5]["choices"][0]["finish_reason"] == "length"
    assert chunks[6]["choices"] == [] and chunks[6]["usage"]["completion_tokens"] == 4
    assert chunks[6]["usage"]["prompt_tokens"] == 3
    assert ev[1][0] >= 0.055  # first content after ttft
    rec = fake.last("/chat/completions")
    assert rec.headers["x-request-id"] == "rid-1" and rec.headers["Authorization"] == "Bearer up"
    assert rec.body["max_tokens"] == 4
    assert fake.stats.completed_streams == 1 and fake.stats.open_streams == 0


async def test_per_request_options_header_and_body(fake):
    async with aiohttp.ClientSession() as s:
        body = _chat(fake={"ttft_ms": 0, "tokens": 3, "reasoning": 1, "keepalive": 2,
                           "fault": "no_usage"})
        async with s.post(fake.base_url + "/v1/chat/completions", json=body,
                          headers={"x-fake-itl-ms": "0"}) as r:
            ev = await _events(r)
        raw = [d for _, d in ev]
        assert raw[-1] == "[DONE]" and all('"usage"' not in d for d in raw)
        deltas = [json.loads(d)["choices"][0].get("delta") for d in raw[1:-1]]
        assert deltas[:2] == [{"content": ""}, {"content": ""}]
        assert deltas[2] == {"reasoning_content": "t0 "} and deltas[3] == {"content": "t1 "}
        async with s.post(fake.base_url + "/v1/chat/completions",
                          json=_chat(fake={"tool_calls": True, "tokens": 2, "ttft_ms": 0})) as r:
            ev = await _events(r)
        call = json.loads(ev[1][1])["choices"][0]["delta"]["tool_calls"][0]
        assert call["function"]["name"] == "fake_tool"


@pytest.mark.parametrize("code", [500, 502, 503, 429])
async def test_http_faults(fake, code):
    async with aiohttp.ClientSession() as s:
        async with s.post(fake.base_url + "/v1/chat/completions",
                          json=_chat(fake={"fault": str(code), "retry_after": 2})) as r:
            assert r.status == code
            assert (await r.json())["error"]["code"] == code
            if code == 429:
                assert r.headers["Retry-After"] == "2"


async def test_fail_times_then_ok(fake):
    async with aiohttp.ClientSession() as s:
        statuses = []
        for _ in range(3):
            async with s.post(fake.base_url + "/v1/completions",
                              json={"prompt": "x", "fake": {"fault": "503", "fail_times": 2}},
                              headers={"x-request-id": "same"}) as r:
                statuses.append(r.status)
    assert statuses == [503, 503, 200]


async def test_connection_faults(fake):
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with s.post(fake.base_url + "/v1/chat/completions",
                              json=_chat(fake={"fault": "close"})) as r:
                await r.read()
        with pytest.raises(aiohttp.ClientPayloadError):
            async with s.post(fake.base_url + "/v1/chat/completions",
                              json=_chat(fake={"fault": "cut", "cut_after": 1})) as r:
                await _events(r)
        async with s.post(fake.base_url + "/v1/chat/completions",
                          json=_chat(fake={"fault": "malformed", "cut_after": 1})) as r:
            raw = [d for _, d in await _events(r)]
        assert any(d.startswith('{"id": "broken"') for d in raw)


async def test_stall_then_client_gone_counts_cancelled(fake):
    async with aiohttp.ClientSession() as s:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                async with s.post(fake.base_url + "/v1/chat/completions",
                                  json=_chat(fake={"fault": "stall_first"})) as r:
                    await _events(r)
    for _ in range(100):
        if fake.stats.cancelled_streams:
            break
        await asyncio.sleep(0.02)
    assert fake.stats.cancelled_streams == 1 and fake.stats.open_streams == 0


async def test_non_stream_models_tokenize(fake):
    async with aiohttp.ClientSession() as s:
        async with s.post(fake.base_url + "/v1/chat/completions",
                          json={"messages": [{"role": "user", "content": "hi there"}]}) as r:
            out = await r.json()
        assert out["choices"][0]["message"]["content"] == "t0 t1 t2 t3 t4 t5 "
        assert out["usage"] == {"prompt_tokens": 2, "completion_tokens": 6, "total_tokens": 8}
        async with s.post(fake.base_url + "/tokenize",
                          json={"messages": [{"role": "user", "content": "a b"}]}) as r:
            assert await r.json() == {"tokens": ["a", "b"], "count": 2}
        async with s.get(fake.base_url + "/v1/models") as r:
            assert (await r.json())["data"][0]["id"] == "fake-model"
        async with s.post(fake.base_url + "/v1/completions",
                          json={"prompt": "x", "fake": {"bogus": 1}}) as r:
            assert r.status == 400


def test_run_in_thread_and_cli():
    url, stop = run_in_thread(FakeConfig(ttft_ms=0, itl_ms=0, tokens=2))
    try:
        import urllib.request
        with urllib.request.urlopen(url + "/health", timeout=5) as r:
            assert json.loads(r.read()) == {"status": "ok"}
    finally:
        stop()
    body = _cli_completion(["--ttft-ms", "0", "--itl-ms", "0", "--tokens", "3"],
                           b'{"prompt": "a"}')
    assert json.loads(body)["usage"]["completion_tokens"] == 3


def _cli_completion(flags: list[str], body: bytes) -> bytes:
    """Start the fake with ``python -m fakeupstream <flags>``, POST ``body`` to
    /v1/completions, return the response body."""
    proc = subprocess.Popen([sys.executable, "-m", "fakeupstream", "--port", "0",
                             *flags], stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert line.startswith("listening http://127.0.0.1:")
        import urllib.request
        req = urllib.request.Request(line.split()[1] + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.read()
    finally:
        proc.terminate()
        proc.wait(10)


# ---- precise timers and stamps (accuracy benchmark) ----------------------------------------
precise = pytest.mark.skipif(not precise_timers_available(), reason="timerfd is Linux-only")


@precise
async def test_precise_mode_first_content_on_time_and_stamped(tmp_path):
    log = tmp_path / "stamps.jsonl"
    f = FakeUpstream(FakeConfig(ttft_ms=50, itl_ms=5, tokens=3, precise_timers=True,
                                stamp=True, stamp_log=str(log)))
    await f.start()
    try:
        assert f.precise
        late_ms, client_ms = [], []
        async with aiohttp.ClientSession() as s:
            for i in range(3):
                t0 = time.perf_counter()  # before the request: the fake receives it later
                async with s.post(f.base_url + "/v1/chat/completions", json=_chat(),
                                  headers={"x-request-id": f"rid-{i}"}) as r:
                    ev = await _events(r, t0)
                chunks = [json.loads(d) for _, d in ev[:-1]]
                assert "fake_sent_ns" not in chunks[0]  # role chunk: not content
                content = chunks[1:4]
                recv = content[0]["fake_recv_ns"]
                sent = [c["fake_sent_ns"] for c in content]
                # Never early, on the absolute schedule: token k at recv + ttft + k*itl.
                for k, t in enumerate(sent):
                    assert t - recv >= (50 + 5 * k) * 1e6
                late_ms.append((sent[0] - recv) / 1e6 - 50)
                client_ms.append(ev[1][0] * 1000)
    finally:
        await f.stop()
    assert min(client_ms) >= 50  # the client started its clock before the fake's receipt
    # Generous bounds (a loaded 2-core CI box): typically < 0.1 ms late and < 2 ms on the client.
    assert sorted(late_ms)[1] < 20 and sorted(client_ms)[1] < 50 + 100
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [x["request_id"] for x in lines] == ["rid-0", "rid-1", "rid-2"]
    assert all(x["first_sent_ns"] - x["recv_ns"] >= 50e6 for x in lines)
    assert all(set(x) == {"request_id", "recv_ns", "first_sent_ns", "recv_unix_ns",
                          "first_sent_unix_ns"} for x in lines)


async def test_stamp_is_per_request_and_off_by_default(fake):
    async with aiohttp.ClientSession() as s:
        async with s.post(fake.base_url + "/v1/completions",
                          json={"prompt": "x", "stream": True,
                                "fake": {"stamp": True, "ttft_ms": 0, "itl_ms": 0}}) as r:
            stamped = [json.loads(d) for _, d in await _events(r) if d != "[DONE]"]
        async with s.post(fake.base_url + "/v1/chat/completions",
                          json=_chat(fake={"ttft_ms": 0, "itl_ms": 0})) as r:
            plain = [d for _, d in await _events(r)]
    assert all("fake_sent_ns" in c and "fake_recv_ns" in c for c in stamped[:6])
    assert "fake_sent_ns" not in stamped[6]  # the finish chunk carries no stamp
    assert not any("fake_sent_ns" in d for d in plain)


@precise
async def test_precise_timer_cancelled_sleeper_does_not_block_others():
    timer = PreciseTimer(finish_us=0)
    try:
        t0 = time.monotonic_ns()
        first = asyncio.ensure_future(timer.sleep_until(t0 + 20_000_000))
        await asyncio.sleep(0)
        first.cancel()
        await timer.sleep_until(t0 + 30_000_000)
        assert time.monotonic_ns() - t0 >= 30_000_000
        await timer.sleep_until(t0)  # past deadline: returns at once
    finally:
        timer.close()


def test_cli_precise_flags():
    body = _cli_completion(["--ttft-ms", "5", "--itl-ms", "0", "--tokens", "2",
                            "--precise-timers", "--stamp", "--loop", "asyncio"],
                           b'{"prompt": "a", "stream": true}')
    assert b'"fake_sent_ns":' in body
