"""Overlap scheduling (``async_scheduling``): step N+1 is launched before step N's sampled
ids are read. On the CPU nothing overlaps, but the bookkeeping is the same, so every
request must get exactly the tokens and finish reasons it gets without it; and a step's
tokens must reach an AsyncEngine consumer before the next step's ids are read."""
from __future__ import annotations

import itertools
import random
import threading
import time

import pytest
import torch

from backend.engine.async_engine import AsyncEngine
from backend.engine.config import EngineConfig
from backend.engine.cuda_graph import StepGraphs
from backend.engine.sampling import SamplingParams
from backend.engine.step_inputs import build_step, pending_token, split_on_device
from backend.engine.scheduler import ScheduledBatch
from backend.engine.sequence import Sequence
from backend.layers.attention import Attention, AttentionMetadata, triton_attention
from tests.backend.tiny_models import source_from_hf


def _prompts(n: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(5, 60))] for _ in range(n)]


def _drive(engine, requests: dict, adds: dict[int, list[str]] | None = None,
           aborts: dict[int, str] | None = None) -> dict:
    """Step ``engine``; add the requests named in ``adds[step]`` (all at step 0 when None)
    and abort ``aborts[step]``: {request id: (tokens, finish reason, error)}."""
    adds = adds if adds is not None else {0: list(requests)}
    aborts = aborts or {}
    result = {rid: ([], None, None) for rid in requests}

    def take(out) -> None:
        tokens, _, _ = result[out.request_id]
        result[out.request_id] = (tokens + out.new_token_ids, out.finish_reason, out.error)

    step = 0
    while step <= max(adds) or engine.has_unfinished():
        for rid in adds.get(step, []):
            engine.add_request(rid, *requests[rid])
        if step in aborts and (out := engine.abort_request(aborts[step])) is not None:
            take(out)
        for out in engine.step():
            take(out)
        step += 1
        assert step < 500
    return result


def _both(make_engine, requests, **kwargs) -> tuple[dict, dict, list]:
    """The same script with async scheduling off and on: (off, on, engines)."""
    engine_kw = kwargs.pop("engine_kw", {})
    engines = [make_engine(async_scheduling=a, **engine_kw) for a in (False, True)]
    off, on = (_drive(e, requests, **kwargs) for e in engines)
    return off, on, engines


def test_build_step_matches_per_token_reference() -> None:
    """The vectorised inputs equal a per-token construction (decodes, chunks mid-prompt,
    a chunk reaching the end, a pending placeholder)."""
    def seq(tokens, computed, table):
        s = Sequence("r", list(tokens), len(tokens), SamplingParams())
        s.num_computed, s.block_table = computed, list(table)
        return s
    a = seq(list(range(10, 30)) + [pending_token(1)], 20, [7, 3])  # decode at 20
    b = seq(range(5, 40), 0, [2, 9, 4])  # chunk 0..12
    c = seq(range(5, 23), 16, [5, 6])  # chunk 16..17: reaches the end
    batch = ScheduledBatch([a], [(b, 13), (c, 2)])
    host = build_step(batch, block_size=16)
    ref_ids, ref_pos, ref_slots = [], [], []
    for s, start, n in ((a, 20, 1), (b, 0, 13), (c, 16, 2)):
        for p in range(start, start + n):
            ref_ids.append(s.token_ids[p])
            ref_pos.append(p)
            ref_slots.append(s.block_table[p // 16] * 16 + p % 16)
    assert host.ids.tolist() == ref_ids and host.has_pending
    assert host.positions.tolist() == ref_pos and host.slots.tolist() == ref_slots
    assert host.rows.tolist() == [0, 15]  # the decode and c's last token
    assert host.context_lens.tolist() == [21, 13, 18]
    assert host.query_start_loc.tolist() == [0, 1, 14, 16]
    assert host.block_tables.tolist() == [[7, 3], [2, 9], [5, 6]]
    assert host.prefill_spans == [(1, 13, 13), (14, 2, 18)]
    assert (host.max_decode_context, host.min_decode_context) == (21, 21)


@pytest.mark.parametrize("decodes,chunk", [(1, 13), (2, 7), (3, 30), (5, 1)])
def test_device_views_are_16_byte_aligned_and_exact(decodes, chunk) -> None:
    """Every view the kernels receive starts 16-byte aligned whatever the step's shape
    (Triton compiles a kernel variant per pointer alignment), and holds the host values;
    the prefill rows that the attention backend slices past the decodes are aligned too."""
    seqs = []
    for i in range(decodes):
        s = Sequence(f"d{i}", list(range(3, 3 + 20 + i)), 20 + i, SamplingParams())
        s.num_computed, s.block_table = 19 + i, [i + 1, i + 2]
        seqs.append(s)
    p = Sequence("p", list(range(40, 40 + chunk + 5)), chunk + 5, SamplingParams())
    p.num_computed, p.block_table = 5, [30, 31, 32]
    host = build_step(ScheduledBatch(seqs, [(p, chunk)]), block_size=16)
    dev = split_on_device(host, torch.device("cpu"), torch.zeros(8, dtype=torch.long))
    views = {"ids": (dev.input_ids, host.ids), "positions": (dev.positions, host.positions),
             "slots": (dev.slot_mapping, host.slots), "rows": (dev.logits_rows, host.rows),
             "context_lens": (dev.context_lens, host.context_lens),
             "query_start_loc": (dev.query_start_loc, host.query_start_loc),
             "block_tables": (dev.block_tables, host.block_tables)}
    for name, (t, ref) in views.items():
        assert t.data_ptr() % 16 == 0, name
        assert t.tolist() == ref.tolist(), name
    meta = AttentionMetadata(dev.slot_mapping, dev.block_tables, dev.context_lens,
                             dev.query_start_loc, num_decode=decodes,
                             prefill_spans=host.prefill_spans,
                             max_decode_context=host.max_decode_context,
                             min_decode_context=host.min_decode_context)
    attn = Attention(4, 2, 8, "triton", kv_cache=None)
    for t in attn.prepare(meta).extra["prefill"]:
        assert t.data_ptr() % 16 == 0


def test_identical_tokens_with_eos_stop_ids_and_lengths(tiny_llama, make_engine) -> None:
    prompts = _prompts(6, seed=11)
    plain = make_engine(async_scheduling=False)
    # learn a token the model emits mid-stream, then make it EOS and a stop id elsewhere
    probe = plain.generate([prompts[0]], SamplingParams(max_tokens=12, temperature=0.0,
                                                        ignore_eos=True))[0]
    eos = probe[4]
    source = source_from_hf(tiny_llama, eos=(eos,))
    lengths = [12, 12, 3, 20, 1, 15]
    requests = {f"r{i}": (p, SamplingParams(max_tokens=n, temperature=0.0))
                for i, (p, n) in enumerate(zip(prompts, lengths))}
    requests["stop"] = (prompts[0], SamplingParams(max_tokens=20, temperature=0.0,
                                                   ignore_eos=True,
                                                   stop_token_ids=(probe[2],)))
    requests["min"] = (prompts[0], SamplingParams(max_tokens=9, temperature=0.0,
                                                  min_tokens=6))
    requests["seeded"] = (prompts[2], SamplingParams(max_tokens=10, temperature=0.8,
                                                     seed=5, ignore_eos=True))
    off, on, _ = _both(make_engine, requests, engine_kw={"source": source},
                       adds={0: ["r0", "r1", "r2", "stop"], 2: ["r3", "min"],
                             3: ["r4", "r5", "seeded"]})
    assert on == off
    # EOS and the stop id end their streams inside them, and are not content
    assert off["r0"] == (probe[:probe.index(eos)], "stop", None)
    assert off["stop"] == (probe[:probe.index(probe[2])], "stop", None)
    assert {reason for _, reason, _ in off.values()} == {"stop", "length"}


def test_identical_tokens_with_abort_and_preemption(make_engine) -> None:
    prompts = _prompts(6, seed=4)
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    requests = {f"r{i}": (p, params) for i, p in enumerate(prompts)}
    # a cache of a few blocks: running decodes preempt each other and recompute
    off, on, engines = _both(make_engine, requests, aborts={5: "r2", 9: "r4"},
                             engine_kw={"kv_cache_memory_gib": 10 * 8192 / 2**30})
    # an abort lands one step earlier in the stream with async scheduling: the outputs
    # a step returns are the previous step's
    for rid in ("r2", "r4"):
        (tokens, reason, _), ref = on.pop(rid), off.pop(rid)
        assert reason == ref[1] == "abort"
        assert tokens == ref[0][:len(tokens)] and len(tokens) >= len(ref[0]) - 1
    assert on == off
    assert all(e.scheduler.preemptions_total > 0 for e in engines)


def test_failing_request_is_isolated_with_a_step_in_flight(make_engine) -> None:
    """A step that raises for one request (its prompt holds a poison token) fails only
    that request, also when the step before it is still in flight."""
    poison = 2
    prompts = _prompts(4, seed=8)
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    requests = {f"r{i}": (p, params) for i, p in enumerate(prompts)}
    requests["bad"] = (prompts[0][:5] + [poison] + prompts[0][5:], params)
    engines = [make_engine(async_scheduling=a) for a in (False, True)]
    for engine in engines:
        forward = engine.runner.model.forward

        def failing(ids, *args, forward=forward):
            if bool((ids == poison).any()):
                raise RuntimeError("poisoned batch")
            return forward(ids, *args)
        engine.runner.model.forward = failing
    off, on = (_drive(e, requests, adds={0: ["r0", "r1"], 2: ["bad", "r2", "r3"]})
               for e in engines)
    assert on == off
    assert off["bad"][1] == "error" and "poisoned batch" in off["bad"][2]
    alone = make_engine().generate([prompts[2]], params)[0]
    assert off["r2"] == (alone, "length", None)


@pytest.mark.parametrize("async_scheduling", [False, True])
async def test_tokens_reach_the_consumer_before_the_next_step_is_read(
        tiny_source, async_scheduling) -> None:
    """The read of step i's sampled ids waits until the consumer holds step i-1's token:
    an engine that kept a step's outputs until the next one finished would stall here
    (each wait gives up after 10 s, and the test then fails on the record)."""
    config = EngineConfig(kv_cache_memory_gib=0.005, max_model_len=128, dtype="float32",
                          async_scheduling=async_scheduling)
    engine = AsyncEngine(config, tiny_source)
    await engine.start()
    received = [threading.Event() for _ in range(8)]
    released: list[bool] = []
    runner = engine.engine.runner
    launch, launches = runner.launch, itertools.count()

    def gated_launch(batch):
        ids, step = launch(batch), next(launches)
        read = ids.tolist

        def tolist():
            released.append(step == 0 or received[step - 1].wait(10.0))
            return read()
        ids.tolist = tolist
        return ids
    runner.launch = gated_launch
    try:
        got = []
        async for out in engine.generate("a", list(range(3, 20)), SamplingParams(
                max_tokens=8, temperature=0.0, ignore_eos=True)):
            for _ in out.new_token_ids:
                received[len(got)].set()
                got.append(out)
        assert len(got) == 8 and released == [True] * 8
    finally:
        await engine.stop()


class _EagerReplay:
    """Stands in for a captured CUDA graph on the CPU: a replay re-runs the forward on the
    graphs' fixed input buffers and writes the fixed output, as a graph replay would."""

    replays: list[tuple[int, int]] = []

    def __init__(self, graphs: StepGraphs, key: tuple[int, int]) -> None:
        self.graphs, self.key = graphs, key

    def replay(self) -> None:
        self.replays.append(self.key)
        self.graphs.outputs[self.key].copy_(self.graphs._forward(self.key))


class _CpuGraphs(StepGraphs):
    def _capture(self, key: tuple[int, int]) -> None:
        self.outputs[key] = self._forward(key)
        self.graphs[key] = _EagerReplay(self, key)


@pytest.fixture
def replays():
    _EagerReplay.replays = []
    yield _EagerReplay.replays


def test_graph_inputs_staging_gives_identical_tokens(make_engine, replays) -> None:
    """The decode-graph path (one staging buffer, packed block tables, padded rows,
    pending ids resolved inside the graph) gives the tokens of the eager path, with the
    graphs' forward run eagerly on the CPU."""
    prompts = _prompts(5, seed=21)
    plist = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
             for n in (3, 9, 17, 6, 12)]  # the decode batch shrinks through 5, 4, 3, 2, 1
    eager = make_engine(async_scheduling=False).generate(prompts, plist)
    engine = make_engine(async_scheduling=True, block_size=4)
    engine.runner.graphs = _CpuGraphs(engine.runner, max_batch=8)
    assert engine.generate(prompts, plist) == eager
    assert {8, 4, 2, 1} <= {b for b, _ in replays}  # padded rows (5 decodes replay size 8)
    assert all(p == 0 for _, p in replays)  # sdpa: prefill steps run eagerly


@pytest.mark.skipif(triton_attention is None, reason="triton not installed")
def test_prefill_graphs_give_identical_tokens(make_engine, replays) -> None:
    """Steps carrying prefill chunks (prompts alone, chunks beside decodes, several chunks,
    a prefix-cache hit) replay the graph of their padded shape (decode rows padded, prefill
    tokens padded to a bucket, empty chunk slots) and give the eager path's tokens."""
    shared = list(range(40, 72))  # two sequences share 32 tokens: a prefix-cache hit
    prompts = _prompts(4, seed=5) + [shared + [9, 8, 7], shared + [3]]
    plist = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
             for n in (4, 7, 3, 6, 5, 4)]
    kw = dict(attention="triton", block_size=4, max_num_batched_tokens=48, max_num_seqs=8)
    eager = make_engine(async_scheduling=False, cuda_graph=False, **kw)
    want = {i: eager.generate([p], [s])[0] for i, (p, s) in enumerate(zip(prompts, plist))}
    engine = make_engine(async_scheduling=True, **kw)
    engine.runner.graphs = graphs = _CpuGraphs(engine.runner, 8, max_prefill_tokens=48,
                                               mixed=True)
    assert graphs.prefill_tokens == [32, 48] and graphs.mixed_decodes == [0, 8]
    requests = {str(i): (p, s) for i, (p, s) in enumerate(zip(prompts, plist))}
    # arrivals spread over steps, so chunks run beside decodes
    got = _drive(engine, requests, adds={0: ["0", "1"], 2: ["2", "3", "4"], 5: ["5"]})
    assert {rid: tokens for rid, (tokens, _, _) in got.items()} == \
        {str(i): want[i] for i in want}
    prefill_keys = {k for k in replays if k[1]}
    assert any(b == 0 for b, _ in prefill_keys) and any(b > 0 for b, _ in prefill_keys)


def test_step_stats_name_the_batch_each_duration_belongs_to(make_engine) -> None:
    """With overlap the observer hears of each launched batch once, when its ids are read,
    with its own shape (the same shapes as without overlap) and the wait for its ids: a
    device that is slow on a prefill step (injected: reading that step's ids takes 50 ms
    longer) shows in that step's duration, not in the decode step launched after it."""
    requests = {f"r{i}": (p, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
                for i, p in enumerate(_prompts(2, 11))}
    shapes = {}
    for a in (False, True):
        engine = make_engine(async_scheduling=a, max_num_batched_tokens=64)
        launch = engine.runner.launch

        def slow_prefill_ids(batch, launch=launch):
            ids = launch(batch)
            if batch.prefills:
                read = ids.tolist
                ids.tolist = lambda: (time.sleep(0.05), read())[1]
            return ids
        engine.runner.launch = slow_prefill_ids
        steps = []
        engine.step_observer = steps.append
        _drive(engine, requests)
        assert all(s.duration_s >= 0.05 for s in steps if s.num_prefill_tokens)
        shapes[a] = [(s.batch_size, s.num_prefill_tokens, s.num_decode_tokens) for s in steps]
    assert shapes[True] == shapes[False]
    assert shapes[False][0][1] > 0 and shapes[False][-1][1] == 0
