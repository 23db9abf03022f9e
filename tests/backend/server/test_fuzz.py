"""A short Hypothesis run of the backend fuzzer against the real server and engine: every
answer a 200 or an OpenAI-style 4xx, never a 5xx or a hang; the server alive afterwards with
every KV block free. (`python -m benchmarks.fuzz_backend` runs 1,000+ cases.)"""
from __future__ import annotations

import asyncio

import httpx

from benchmarks.fuzz_backend import Tally, fuzz

from .harness import wait_engine_idle


async def test_fuzzed_bodies_never_get_a_5xx(smollm2):
    tally = Tally()
    await asyncio.to_thread(fuzz, smollm2.base_url, 150, tally, True)
    assert sum(tally.statuses.values()) >= 150 and not tally.bad
    # both the engine and the checks at the door were exercised
    assert tally.statuses["200"] >= 5 and tally.statuses["400"] >= 30, tally.statuses
    with httpx.Client() as client:
        assert client.get(f"{smollm2.base_url}/health").status_code == 200
    s = await wait_engine_idle(smollm2)
    assert (s.running, s.waiting, s.kv_blocks_used) == (0, 0, 0)
