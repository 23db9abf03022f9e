"""AsyncEngine: the engine thread bridged to asyncio; early exit aborts and frees blocks."""
from __future__ import annotations

import asyncio
import time

import pytest

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.engine.errors import EngineNotRunning, RequestRejected
from backend.engine.sampling import SamplingParams

CFG = EngineConfig(kv_cache_memory_gib=0.005, max_model_len=128, dtype="float32")
LONG = SamplingParams(max_tokens=90, temperature=0.0, ignore_eos=True)


@pytest.fixture
async def engine(tiny_source):
    steps = []
    eng = AsyncEngine(CFG, tiny_source, step_observer=steps.append)
    eng.steps = steps
    await eng.start()
    yield eng
    await _until(lambda: eng.stats().kv_blocks_used == 0 and eng.stats().running == 0)
    assert eng.engine.block_manager.num_used == 0
    await eng.stop()


async def _until(cond, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_streams_tokens_and_final_timings(engine) -> None:
    outs = [o async for o in engine.generate("a", list(range(3, 30)),
                                             SamplingParams(max_tokens=6, temperature=0.0,
                                                            ignore_eos=True))]
    assert sum(len(o.new_token_ids) for o in outs) == 6
    assert outs[-1].finished and outs[-1].finish_reason == "length"
    assert all(not o.finished and o.timings is None for o in outs[:-1])
    t = outs[-1].timings
    assert 0 <= t.queue_s <= t.first_token_s <= t.e2e_s and t.decode_s >= 0
    assert outs[-1].num_prompt_tokens == 27
    assert engine.steps and engine.steps[0].num_prefill_tokens == 27
    same = engine.engine  # the sync engine agrees with the stream
    assert same.stats().generation_tokens_total == 6


async def test_concurrent_requests_match_sequential(engine) -> None:
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    prompts = [list(range(3 + i, 20 + 3 * i)) for i in range(6)]

    async def collect(i: int, p: list[int]) -> list[int]:
        return [t async for o in engine.generate(f"c{i}", p, params) for t in o.new_token_ids]

    together = await asyncio.gather(*(collect(i, p) for i, p in enumerate(prompts)))
    alone = [await collect(100 + i, p) for i, p in enumerate(prompts)]
    assert together == alone
    assert max(s.batch_size for s in engine.steps) > 1


async def test_leaving_early_aborts_and_frees_blocks(engine) -> None:
    engine.engine.step_observer = lambda _: time.sleep(0.01)  # >= 0.7 s to run to the end
    gen = engine.generate("leave", list(range(3, 60)), LONG)
    async for out in gen:
        assert not out.finished
        break
    await gen.aclose()  # what `async with aclosing(...)` / garbage collection does
    await _until(lambda: engine.stats().running == 0)
    assert engine.stats().kv_blocks_used == 0
    assert engine.stats().generation_tokens_total < 128 - 57  # stopped before the end


async def test_cancelled_task_aborts(engine) -> None:
    started = asyncio.Event()

    async def consume() -> None:
        async for _ in engine.generate("cancel", list(range(3, 60)), LONG):
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _until(lambda: engine.stats().running == 0 and engine.stats().kv_blocks_used == 0)


async def test_abort_by_id_finishes_the_stream(engine) -> None:
    outs = []
    async for out in engine.generate("byid", list(range(3, 40)), LONG):
        outs.append(out)
        if len(outs) == 2:
            engine.abort("byid")
    assert outs[-1].finished and outs[-1].finish_reason == "abort"


async def test_check_request_rejects_with_lengths(engine) -> None:
    with pytest.raises(RequestRejected) as info:
        engine.check_request(500, SamplingParams())
    assert "500" in info.value.message and "128" in info.value.message
    with pytest.raises(RequestRejected):
        async for _ in engine.generate("long", [5] * 200, SamplingParams()):
            pass
    assert engine.max_model_len == 128


async def test_request_that_can_never_fit_the_cache(tiny_source) -> None:
    eng = AsyncEngine(EngineConfig(kv_cache_memory_gib=4 * 8192 / 2**30, max_model_len=256,
                                   dtype="float32"),
                      tiny_source)
    with pytest.raises(EngineNotRunning):
        eng.check_request(10, SamplingParams())
    await eng.start()
    try:
        assert eng.stats().kv_blocks_total == 4
        eng.check_request(30, SamplingParams(max_tokens=34))  # 64 tokens = 4 blocks: fits
        with pytest.raises(RequestRejected, match="KV cache") as info:
            eng.check_request(30, SamplingParams(max_tokens=100))
        assert info.value.param == "max_tokens"
    finally:
        await eng.stop()


async def test_start_failure_is_raised(tiny_source) -> None:
    eng = AsyncEngine(EngineConfig(max_model_len=10**6), tiny_source)
    with pytest.raises(ValueError, match="max_position_embeddings"):
        await eng.start()
