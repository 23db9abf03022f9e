"""Read an SSE response into its ``data:`` payloads (test helper)."""
from __future__ import annotations

import json

import aiohttp

from openai_stream import SSEFramer, is_done


async def read_events(resp: aiohttp.ClientResponse) -> list[object]:
    """Every data payload, JSON-decoded except the literal "[DONE]"; asserts that the server
    sends nothing but data events (no comments or other fields)."""
    framer = SSEFramer()
    events: list[object] = []
    async for chunk in resp.content.iter_any():
        for data, line in framer.feed(chunk):
            assert data is not None, line
            events.append("[DONE]" if is_done(data) else json.loads(data))
    assert framer.end() == [], "the stream ended inside an event"
    return events
