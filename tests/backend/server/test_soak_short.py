"""A 20-second soak (mixed streams, random client aborts, 8 concurrent) against the real
server and engine: nothing fails that the client did not abort, no KV block stays taken, no
error in the log. `python -m benchmarks.soak` runs the long version in its own process."""
from __future__ import annotations

import logging

from benchmarks.soak import run_load

from .harness import wait_engine_idle


async def test_short_soak_leaks_nothing(smollm2, caplog):
    caplog.set_level(logging.WARNING)
    tally = await run_load(smollm2.base_url, 20.0, 8, 0.3, seed=7, max_tokens=16)
    assert tally.sent >= 8 and tally.failed == 0, tally.failures
    assert tally.ok + tally.aborted == tally.sent
    s = await wait_engine_idle(smollm2)
    assert (s.running, s.waiting, s.kv_blocks_used) == (0, 0, 0)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
