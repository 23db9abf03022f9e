"""The openai SDK streams from our backend through the real gateway (`python -m gateway`)."""
from __future__ import annotations

import asyncio
import os
import sys

import pytest
import yaml

KEY = "sk-backend-gateway-test-3f9a"
# Germany, not France: bf16's first answer token to France is a one-step tie (see
# test_openai_sdk) that the prefill's path can flip
QUESTION = [{"role": "user", "content": "What is the capital of Germany?"}]


@pytest.fixture
async def gateway_url(smollm2, tmp_path):
    config = {
        "keys": [{"name": "tester", "env": "FT_BACKEND_GW_KEY", "models": ["*"]}],
        "providers": {"local": {"base_url": f"{smollm2.base_url}/v1", "timeout_seconds": 120,
                                "max_retries": 0}},
        "models": {"smollm2": {"provider": "local", "model": "smollm2-135m-instruct"}},
        "request_log": str(tmp_path / "requests.jsonl"),
        "shutdown_grace_seconds": 2,
    }
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "--config", str(path), "--host", "127.0.0.1",
        "--port", "0", stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "FT_BACKEND_GW_KEY": KEY})
    try:
        line = ""
        while not line.startswith("listening"):  # bounded by the wait_for below
            raw = await asyncio.wait_for(proc.stdout.readline(), 60)
            assert raw, "gateway exited before listening"
            line = raw.decode().strip()
        yield line.split()[-1]
    finally:
        proc.terminate()
        await asyncio.wait_for(proc.wait(), 30)


async def test_openai_sdk_streams_through_the_gateway(gateway_url, sdk_client):
    client = sdk_client(f"{gateway_url}/v1", api_key=KEY, timeout=120)
    stream = await client.chat.completions.create(
        model="smollm2", messages=QUESTION, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True}, extra_headers={"x-request-id": "via-gw-1"})
    chunks = [c async for c in stream]
    role, *content, finish, usage = chunks
    assert role.choices[0].delta.role == "assistant"
    assert "Berlin" in "".join(c.choices[0].delta.content or "" for c in content)
    assert finish.choices[0].finish_reason in ("stop", "length")
    assert usage.choices == [] and usage.usage.completion_tokens >= 2
    # The gateway forwards x-request-id, so the backend's ids carry it; timings ride along.
    assert role.id == "chatcmpl-via-gw-1"
    timings = usage.model_extra["firsttoken_timings"]
    assert timings["prompt_tokens"] == usage.usage.prompt_tokens
    assert 0 < timings["first_token_s"] <= timings["e2e_s"]
