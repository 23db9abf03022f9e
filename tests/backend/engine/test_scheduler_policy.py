"""The step policy for a TTFT SLO: the per-step prefill budget (max_prefill_tokens) and
prefill priority. Scheduler-level tests step a Scheduler by hand (no model); the engine test
runs SmolLM2 under every policy and checks which steps carry prefill and that the greedy
tokens never change."""
from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from backend.engine.block_manager import BlockManager
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.engine.scheduler import ScheduledBatch, Scheduler
from backend.engine.sequence import Sequence

PARAMS = SamplingParams(max_tokens=1000, ignore_eos=True)


def _scheduler(budget: int = 64, **kw) -> Scheduler:
    return Scheduler(BlockManager(256, 16, enable_prefix_caching=False), max_num_seqs=16,
                     max_num_batched_tokens=budget, static=False, **kw)


def _seq(name: str, n: int) -> Sequence:
    return Sequence(name, list(range(3, 3 + n)), n, PARAMS)


def _commit(batch: ScheduledBatch) -> None:
    """What the engine does after running a step: progress, and a token for every sampled
    sequence."""
    sampled = batch.sampled_seqs()
    for seq in batch.decodes:
        seq.num_computed += 1
    for seq, n in batch.prefills:
        seq.num_computed += n
    for seq in sampled:
        seq.token_ids.append(7)


def _step(sched: Scheduler) -> ScheduledBatch:
    batch = sched.schedule()
    _commit(batch)
    return batch


def _decoding(sched: Scheduler, names: list[str]) -> list[Sequence]:
    seqs = [_seq(n, 8) for n in names]
    for s in seqs:
        sched.add(s)
    for _ in range(50):  # prefilled (in chunks when the budget is small)
        if all(s.is_decode for s in seqs):
            break
        _step(sched)
    assert all(s.is_decode for s in seqs)
    return seqs


def test_default_policy_carries_decodes_first_then_prefill() -> None:
    sched = _scheduler()
    running = _decoding(sched, ["a", "b", "c"])
    sched.add(_seq("new", 40))
    batch = _step(sched)
    assert batch.decodes == running
    assert [(s.request_id, n) for s, n in batch.prefills] == [("new", 40)]


def test_max_prefill_tokens_caps_every_step_and_chunks_prompts() -> None:
    sched = _scheduler(budget=64, max_prefill_tokens=16)
    running = _decoding(sched, ["a", "b"])
    sched.add(_seq("long", 40))
    sched.add(_seq("short", 5))
    chunks = []
    for _ in range(4):
        batch = _step(sched)
        assert batch.decodes[:2] == running  # decodes keep their token every step
        assert batch.num_prefill_tokens <= 16
        chunks.append([(s.request_id, n) for s, n in batch.prefills])
    # 40 tokens in chunks of 16, the next prompt admitted only once the budget has room
    assert chunks == [[("long", 16)], [("long", 16)], [("long", 8), ("short", 5)], []]


def test_prefill_budget_is_what_the_decodes_leave_when_smaller() -> None:
    sched = _scheduler(budget=8, max_prefill_tokens=6)
    _decoding(sched, ["a", "b", "c", "d"])
    sched.add(_seq("new", 20))
    batch = _step(sched)
    assert len(batch.decodes) == 4 and batch.num_prefill_tokens == 4  # 8 - 4 decodes < 6


def test_prefill_priority_holds_decodes_back_one_step() -> None:
    sched = _scheduler(prefill_priority=True)
    running = _decoding(sched, ["a", "b", "c"])
    sched.add(_seq("new", 40))
    first = _step(sched)
    assert first.decodes == [] and [(s.request_id, n) for s, n in first.prefills] == [("new", 40)]
    second = _step(sched)  # every decode, the newcomer's first decode included
    assert second.decodes[:3] == running and second.num_prefill_tokens == 0
    assert len(second.decodes) == 4


def test_prefill_priority_never_starves_decodes() -> None:
    """A new prompt every step: each running decode still gets a token every second step."""
    sched = _scheduler(budget=64, prefill_priority=True)
    _decoding(sched, ["a", "b"])
    last_token = {}
    for i in range(40):
        sched.add(_seq(f"n{i}", 20))
        batch = _step(sched)
        for s in batch.decodes:
            last_token[s.request_id] = i
        for s in sched.running:
            if s.request_id in last_token:
                assert i - last_token[s.request_id] <= 1, (s.request_id, i)
        assert batch.num_prefill_tokens <= 64
    assert len(last_token) > 10


def test_prefill_priority_with_a_chunked_prompt_alternates() -> None:
    sched = _scheduler(budget=64, max_prefill_tokens=16, prefill_priority=True)
    _decoding(sched, ["a"])
    sched.add(_seq("long", 48))
    kinds = []
    for _ in range(6):
        b = _step(sched)
        kinds.append((len(b.decodes), b.num_prefill_tokens))
    # P, D+chunk, P, D (the long prompt decodes from its last chunk on)
    assert kinds == [(0, 16), (1, 16), (0, 16), (2, 0), (2, 0), (2, 0)]


def test_prefill_priority_falls_back_when_no_block_is_free() -> None:
    sched = Scheduler(BlockManager(3, 16, enable_prefix_caching=False), max_num_seqs=8,
                      max_num_batched_tokens=64, static=False, prefill_priority=True)
    running = _decoding(sched, ["a", "b"])  # 2 of 3 blocks
    sched.add(_seq("big", 40))  # needs 3 blocks: cannot be admitted
    batch = _step(sched)
    assert batch.decodes == running and batch.prefills == []


def test_config_validates_the_policy() -> None:
    with pytest.raises(ValidationError, match="max_prefill_tokens .*must not exceed"):
        EngineConfig(max_num_batched_tokens=512, max_prefill_tokens=1024)
    with pytest.raises(ValidationError, match="prefill_priority needs scheduling=continuous"):
        EngineConfig(scheduling="static", prefill_priority=True)
    with pytest.raises(ValidationError, match="max_prefill_tokens"):
        EngineConfig(max_prefill_tokens=0)
    with pytest.raises(ValueError, match="max_prefill_tokens"):
        _scheduler(budget=32, max_prefill_tokens=33)
    assert EngineConfig().scheduling_policy() == {
        "scheduling": "continuous", "max_num_seqs": 64, "max_num_batched_tokens": 2048,
        "max_prefill_tokens": 1024, "prefill_priority": False}
    # the default prefill budget never exceeds a smaller step budget
    assert EngineConfig(max_num_batched_tokens=512).scheduling_policy()[
        "max_prefill_tokens"] == 512
    assert EngineConfig(max_prefill_tokens=256, prefill_priority=True).scheduling_policy()[
        "max_prefill_tokens"] == 256


POLICIES = {"default": {}, "prefill budget 8": {"max_prefill_tokens": 8},
            "prefill priority": {"prefill_priority": True},
            "priority + budget 8": {"prefill_priority": True, "max_prefill_tokens": 8}}


def test_engine_policies_change_steps_not_tokens(smollm2_source) -> None:
    """SmolLM2, requests arriving while others decode: the knobs move prefill between steps;
    the greedy tokens are the same under every policy (one set of weights, shared)."""
    rng = random.Random(5)
    vocab = smollm2_source.config.vocab_size
    prompts = [[rng.randrange(100, vocab) for _ in range(n)] for n in (12, 20, 15)]
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    tokens, steps, model = {}, {}, None
    for name, knobs in POLICIES.items():
        engine = LLMEngine(EngineConfig(kv_cache_memory_gib=0.01, max_model_len=64,
                                        dtype="float32", weights_dtype="fp32",
                                        enable_prefix_caching=False, **knobs),
                           smollm2_source, model=model)
        model = engine.runner.model
        seen = steps[name] = []
        engine.step_observer = seen.append
        out = {i: [] for i in range(len(prompts))}
        for i in range(100):
            if i % 2 == 0 and i // 2 < len(prompts):  # a new request every second step
                engine.add_request(str(i // 2), prompts[i // 2], params)
            elif not engine.has_unfinished():
                break
            for o in engine.step():
                out[int(o.request_id)].extend(o.new_token_ids)
        tokens[name] = [out[i] for i in range(len(prompts))]
    for name in POLICIES:
        assert tokens[name] == tokens["default"], name
    assert all(len(t) == 4 for t in tokens["default"])

    def mixed(name: str) -> int:
        return sum(1 for s in steps[name] if s.num_prefill_tokens and s.num_decode_tokens)
    assert mixed("default") >= 2  # the later arrivals share steps with decodes
    assert mixed("prefill priority") == 0  # whole prompts: prefill steps carry no decode
    assert max(s.num_prefill_tokens for s in steps["default"]) == 20
    for name in ("prefill budget 8", "priority + budget 8"):
        assert max(s.num_prefill_tokens for s in steps[name]) == 8
    # under priority a chunked prompt's steps alternate: prefill only, then decodes (+ chunk)
    assert any(s.num_prefill_tokens and not s.num_decode_tokens
               for s in steps["priority + budget 8"][1:])


def test_the_default_prefill_budget_chunks_a_long_prompt(smollm2_source) -> None:
    """No knob set: a 1,500-token prompt is prefilled in a 1,024-token chunk and the rest, though
    the step's whole budget (2,048) would hold it."""
    engine = LLMEngine(EngineConfig(kv_cache_memory_gib=0.2, max_model_len=1600,
                                    enable_prefix_caching=False), smollm2_source)
    seen = []
    engine.step_observer = seen.append
    rng = random.Random(1)
    prompt = [rng.randrange(100, 40000) for _ in range(1500)]
    engine.add_request("long", prompt, SamplingParams(max_tokens=2, ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert [s.num_prefill_tokens for s in seen if s.num_prefill_tokens] == [1024, 476]


def test_prefill_chunks_per_step_capped_at_the_graph_slots():
    # a burst of short prompts (e.g. served from the prefix cache): 12 fit the token budget
    # of one step, but a step carries at most max_prefill_seqs chunks, the running decodes
    # still go first, and every prompt is admitted in arrival order
    sched = _scheduler(budget=64, max_prefill_seqs=4)
    old = _decoding(sched, ["a", "b"])
    burst = [_seq(f"p{i}", 5) for i in range(12)]
    for s in burst:
        sched.add(s)
    seen = []
    for _ in range(3):
        batch = _step(sched)
        assert {s.request_id for s in old} <= {s.request_id for s in batch.decodes}
        assert len(batch.prefills) == 4
        seen += [s.request_id for s, _ in batch.prefills]
    assert seen == [s.request_id for s in burst] and all(s.is_decode for s in burst)
    # without the cap the same burst fills one step
    free = _scheduler(budget=64)
    for s in [_seq(f"q{i}", 5) for i in range(12)]:
        free.add(s)
    assert len(free.schedule().prefills) == 12


def test_static_scheduling_ignores_the_chunk_cap():
    sched = Scheduler(BlockManager(256, 16, enable_prefix_caching=False), max_num_seqs=16,
                      max_num_batched_tokens=64, static=True, max_prefill_seqs=4)
    for i in range(6):
        sched.add(_seq(f"s{i}", 5))
    assert len(sched.schedule().prefills) == 6
