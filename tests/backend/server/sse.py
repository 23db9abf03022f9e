"""Read an SSE response into its ``data:`` payloads (test helper)."""
from __future__ import annotations

import json

import aiohttp


async def read_events(resp: aiohttp.ClientResponse) -> list[object]:
    """Every data payload, JSON-decoded except the literal "[DONE]"; asserts SSE framing."""
    events: list[object] = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\n")
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events
