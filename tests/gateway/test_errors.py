"""Client errors (4xx), upstream faults before the first byte (retries, failover, 5xx) and
after it (error event, no [DONE])."""
from __future__ import annotations

import json

import aiohttp
import openai
import pytest

from tests.gateway.conftest import CLIENT_KEY, Gateway

MSG = [{"role": "user", "content": "hi"}]
AUTH = {"Authorization": f"Bearer {CLIENT_KEY}"}


async def _post(gw: Gateway, body, headers=None, path="/v1/chat/completions", raw=None):
    async with aiohttp.ClientSession() as s:
        async with s.post(gw.url + path, json=None if raw is not None else body,
                          data=raw, headers={**AUTH, **(headers or {})}) as r:
            return r.status, dict(r.headers), await r.read()


def _err(raw: bytes) -> dict:
    err = json.loads(raw)["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


@pytest.mark.parametrize("body,param", [
    ({"messages": MSG}, "model"),
    ({"model": "fast"}, "messages"),
    ({"model": "fast", "messages": []}, "messages"),
    ({"model": "fast", "messages": MSG, "stream": "yes"}, "stream"),
    ({"model": "fast", "messages": MSG, "stream_options": 3}, "stream_options"),
])
async def test_400_names_the_field(gw: Gateway, body, param):
    status, _, raw = await _post(gw, body)
    assert status == 400 and _err(raw)["param"] == param
    assert gw.fake.stats.requests == 0  # nothing reached the upstream


async def test_400_bad_json_and_completions_prompt(gw: Gateway):
    status, _, raw = await _post(gw, None, raw=b"{not json")
    assert status == 400 and _err(raw)["type"] == "invalid_request_error"
    status, _, raw = await _post(gw, {"model": "fast"}, path="/v1/completions")
    assert status == 400 and _err(raw)["param"] == "prompt"


async def test_401_403_404_413(make_gateway):
    gw = await make_gateway(limits={"max_body_bytes": 2048})
    with pytest.raises(openai.AuthenticationError):
        await gw.client(key="wrong").chat.completions.create(model="fast", messages=MSG)
    status, _, raw = await _post(gw, {"model": "fast", "messages": MSG},
                                 headers={"Authorization": ""})
    assert status == 401 and _err(raw)["code"] == "invalid_api_key"
    with pytest.raises(openai.PermissionDeniedError):
        await gw.client(key="sk-narrow-key").chat.completions.create(model="locked",
                                                                     messages=MSG)
    with pytest.raises(openai.NotFoundError) as nf:
        await gw.client().chat.completions.create(model="no-such-model", messages=MSG)
    assert nf.value.body["param"] == "model"
    status, _, raw = await _post(gw, {"model": "fast", "messages": [
        {"role": "user", "content": "x" * 5000}]})
    assert status == 413 and _err(raw)["code"] == "request_too_large"
    async with aiohttp.ClientSession() as s:
        async with s.get(gw.url + "/no/such/path") as r:
            assert r.status == 404 and _err(await r.read())
    rows = await gw.wait_rows(5)
    assert [r["status"] for r in rows] == [401, 401, 403, 404, 413]
    assert gw.fake.stats.requests == 0


async def test_missing_provider_key_is_503_naming_variable(gw: Gateway):
    with pytest.raises(openai.InternalServerError) as exc:
        await gw.client().chat.completions.create(model="locked", messages=MSG)
    assert exc.value.status_code == 503 and "GW_UNSET_KEY" in exc.value.message


# No answer (a closed connection) is retried up to max_retries (2); a 5xx answer once.
@pytest.mark.parametrize("fault,retries", [("500", 1), ("502", 1), ("503", 1), ("close", 2)])
async def test_retry_before_first_byte_succeeds(gw: Gateway, fault, retries):
    fake = {"fault": fault, "fail_times": retries, "ttft_ms": 0}
    stream = await gw.client().chat.completions.create(
        model="fast", messages=MSG, stream=True, extra_body={"fake": fake},
        extra_headers={"x-request-id": f"retry-{fault}"})
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text.startswith("t0 t1")
    (row,) = await gw.wait_rows(1)
    assert row["status"] == 200 and row["retries"] == retries
    assert gw.fake.stats.attempts_by_id[f"retry-{fault}"] == retries + 1
    m = await gw.metrics_text()
    assert f'gateway_upstream_retries_total{{model="fast",provider="fake"}} {retries}.0' in m
    assert f'gateway_upstream_errors_total{{model="fast",provider="fake"}} {retries}.0' in m


async def test_retries_exhausted_maps_status(gw: Gateway, caplog):
    for fault, status in (("502", 502), ("503", 503), ("close", 502)):
        with pytest.raises(openai.APIStatusError) as exc:
            await gw.client().chat.completions.create(model="fast", messages=MSG,
                                                      extra_body={"fake": {"fault": fault}})
        assert exc.value.status_code == status
    rows = await gw.wait_rows(3)
    # A 5xx answer is retried once; no answer up to max_retries (2) times.
    assert [r["retries"] for r in rows] == [1, 1, 2]
    # 7 attempts, the fake sees 8 requests: the first "close" attempt reused the 503's idle
    # connection, and a reused connection that dies before its first byte is resent at once
    # (transport.py), which is not a retry
    assert gw.fake.stats.requests == 8
    # Each failed attempt is one log line naming provider, status and code.
    failed = [r.getMessage() for r in caplog.records if r.name == "gateway.upstream"]
    assert len(failed) == 7 and all("provider=fake" in m and "status=" in m for m in failed)


@pytest.mark.parametrize("fake_opts,status,code", [
    ({"nonsense": 1}, 400, "upstream_rejected"),   # the fake's 400 for an unknown option
    ({"fault": "401"}, 502, "upstream_auth_failed"),
    ({"fault": "step_failed"}, 502, "request_failed_in_step"),
])
async def test_never_retried(make_gateway, fake, fake_opts, status, code):
    """4xx-class faults and a request that broke an engine step go back after one attempt,
    even with a second deployment to fail over to."""
    gw = await make_gateway(models={"two": [{"provider": "fake", "model": "x"},
                                            {"provider": "fake", "model": "y"}]})
    got, _, raw = await _post(gw, {"model": "two", "messages": MSG, "fake": fake_opts})
    assert (got, _err(raw)["code"]) == (status, code)
    assert gw.fake.stats.requests == 1
    (row,) = await gw.wait_rows(1)
    assert row["retries"] == 0 and row["status"] == status


async def test_429_fails_over_never_same_deployment(make_gateway, fake):
    gw = await make_gateway(models={"two": [{"provider": "fake", "model": "x"},
                                            {"provider": "fake", "model": "y"}]})
    # Two deployments: the 429 moves the request to the other one at once.
    fake_opts = {"fault": "429", "retry_after": 30, "fail_times": 1, "ttft_ms": 0}
    r = await gw.client().chat.completions.create(
        model="two", messages=MSG, extra_body={"fake": fake_opts},
        extra_headers={"x-request-id": "ra-1"})
    assert r.choices[0].message.content
    (row,) = await gw.wait_rows(1)
    assert row["retries"] == 1 and row["e2e_s"] < 5  # it did not wait Retry-After
    models = [rec.body["model"] for rec in fake.received]
    assert len(models) == 2 and models[0] != models[1]
    # Its Retry-After (30 s) has not passed: the next requests try the other one first,
    # although ties would otherwise rotate.
    for _ in range(2):
        await gw.client().chat.completions.create(model="two", messages=MSG,
                                                  extra_body={"fake": {"ttft_ms": 0}})
    assert [rec.body["model"] for rec in fake.received][2:] == [models[1]] * 2
    # Both rate limited: each tried once, then 429 + the upstream's Retry-After.
    status, headers, raw = await _post(gw, {"model": "two", "messages": MSG,
                                            "fake": {"fault": "429", "retry_after": 30}})
    assert status == 429 and headers["Retry-After"] == "30"
    assert _err(raw)["code"] == "upstream_rate_limited"
    assert fake.stats.requests == 6
    # One deployment: no retry at all.
    status, headers, _ = await _post(gw, {"model": "fast", "messages": MSG,
                                          "fake": {"fault": "429", "retry_after": 0.5}})
    assert status == 429 and headers["Retry-After"] == "0.5" and fake.stats.requests == 7


async def test_failover_to_next_deployment_and_balancing(make_gateway, fake):
    gw = await make_gateway(
        providers={"dead": {"base_url": "http://127.0.0.1:9", "max_retries": 0},
                   "fake": {"base_url": fake.base_url, "max_retries": 0}},
        models={"pair": [{"provider": "dead", "model": "a"}, {"provider": "fake", "model": "b"}],
                "two": [{"provider": "fake", "model": "x"}, {"provider": "fake", "model": "y"}]})
    for _ in range(4):
        r = await gw.client().chat.completions.create(model="pair", messages=MSG,
                                                      extra_body={"fake": {"ttft_ms": 0}})
        assert r.choices[0].message.content
    rows = await gw.wait_rows(4)
    assert all(r["provider"] == "fake" and r["upstream_model"] == "b" for r in rows)
    assert sum(r["retries"] for r in rows) >= 1  # the dead one was tried at least once
    # Two idle deployments: ties rotate, so sequential requests alternate between them.
    for _ in range(4):
        await gw.client().chat.completions.create(model="two", messages=MSG,
                                                  extra_body={"fake": {"ttft_ms": 0}})
    models = [rec.body["model"] for rec in list(gw.fake.received)[-4:]]
    assert sorted(models) == ["x", "x", "y", "y"]


@pytest.mark.parametrize("fault,code", [("cut", "upstream_stream_error"),
                                        ("malformed", "upstream_stream_error")])
async def test_failure_after_first_byte_is_error_event_without_done(gw: Gateway, fault, code):
    body = {"model": "fast", "messages": MSG, "stream": True,
            "fake": {"fault": fault, "cut_after": 2, "ttft_ms": 0}}
    status, _, raw = await _post(gw, body)
    assert status == 200  # headers were already sent
    events = [e for e in raw.split(b"\n\n") if e.startswith(b"data:")]
    assert b"[DONE]" not in raw
    assert json.loads(events[-1][5:])["error"]["code"] == code
    (row,) = await gw.wait_rows(1)
    assert row["status"] == 502 and row["error"].startswith(code)
    assert row["content_chunks"] == 2
    # The SDK surfaces it as an error, never as a shorter successful answer.
    with pytest.raises(openai.APIError):
        stream = await gw.client().chat.completions.create(
            model="fast", messages=MSG, stream=True, extra_body={"fake": body["fake"]})
        async for _ in stream:
            pass


async def test_first_token_timeout_after_role_chunk(make_gateway, fake):
    gw = await make_gateway(providers={"fake": {"base_url": fake.base_url,
                                                "first_token_timeout_seconds": 0.3,
                                                "timeout_seconds": 10}})
    status, _, raw = await _post(gw, {"model": "fast", "messages": MSG, "stream": True,
                                      "fake": {"fault": "stall_first"}})
    assert status == 200 and b"[DONE]" not in raw
    assert b'"code": "upstream_timeout"' in raw
    (row,) = await gw.wait_rows(1)
    assert row["status"] == 504 and 0.3 <= row["e2e_s"] < 5


async def test_total_timeout_mid_stream_and_headers_timeout(make_gateway, fake):
    gw = await make_gateway(providers={"fake": {"base_url": fake.base_url, "max_retries": 0,
                                                "timeout_seconds": 0.5}})
    status, _, raw = await _post(gw, {"model": "fast", "messages": MSG, "stream": True,
                                      "fake": {"fault": "stall_mid", "ttft_ms": 0}})
    assert status == 200 and b"upstream_timeout" in raw and b"[DONE]" not in raw
    # Non-stream: the fake sends no headers until done -> 504 before any byte.
    status, _, raw = await _post(gw, {"model": "fast", "messages": MSG,
                                      "fake": {"ttft_ms": 2000}})
    assert status == 504 and _err(raw)["code"] == "upstream_timeout"


async def test_upstream_4xx_relayed_and_401_becomes_502(gw: Gateway):
    status, _, raw = await _post(gw, {"model": "fast", "messages": MSG,
                                      "fake": {"bogus_option": 1}})
    assert status == 400  # the fake rejects unknown options with 400: relayed, not retried
    assert gw.fake.stats.requests == 1
    status, _, raw = await _post(gw, {"model": "fast", "messages": MSG,
                                      "fake": {"fault": "401"}})
    assert status == 502 and _err(raw)["code"] == "upstream_auth_failed"
    assert gw.fake.stats.requests == 2  # bad upstream credentials are not retried


async def test_least_in_flight_wins(make_gateway, fake):
    gw = await make_gateway(models={"two": [{"provider": "fake", "model": "x"},
                                            {"provider": "fake", "model": "y"}]})
    client = gw.client()
    slow = await client.chat.completions.create(
        model="two", messages=MSG, stream=True,
        extra_body={"fake": {"ttft_ms": 0, "itl_ms": 100, "tokens": 20}})
    first = await slow.__anext__()  # the slow stream is now in flight on one deployment
    busy = gw.fake.last("/chat/completions").body["model"]
    for _ in range(3):
        await client.chat.completions.create(model="two", messages=MSG,
                                             extra_body={"fake": {"ttft_ms": 0}})
    others = [rec.body["model"] for rec in list(gw.fake.received)[-3:]]
    assert first is not None and others == [{"x": "y", "y": "x"}[busy]] * 3
    await slow.close()
