"""Continuous batching, chunked prefill, static batches, preemption, prefix caching: all
must give exactly the tokens a request gets when it runs alone."""
from __future__ import annotations

import random

import torch

from backend.engine.sampling import SamplingParams
from tests.backend.tiny_models import hf_greedy, run_alone

GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _prompts(n: int = 8, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 256) for _ in range(rng.randrange(5, 90))] for _ in range(n)]


def _alone(make_engine, prompts, params=GREEDY) -> list[list[int]]:
    engine = make_engine(enable_prefix_caching=False)
    return [engine.generate([p], params)[0] for p in prompts]


def test_batch_invariance_with_chunked_prefill(make_engine) -> None:
    prompts = _prompts()
    alone = _alone(make_engine, prompts)
    engine = make_engine(max_num_batched_tokens=32)  # forces prompts across several steps
    steps = []
    engine.step_observer = steps.append
    assert engine.generate(prompts, GREEDY) == alone
    # really mixed: some step carried decodes and prefill tokens together, and some
    # prompt was split (a step's prefill tokens hit the budget exactly)
    assert any(s.num_decode_tokens and s.num_prefill_tokens for s in steps)
    assert any(s.num_prefill_tokens + s.num_decode_tokens == 32 for s in steps)
    assert max(s.batch_size for s in steps) == 8


def test_requests_arriving_mid_stream_match(make_engine) -> None:
    prompts = _prompts(6, seed=3)
    alone = _alone(make_engine, prompts)
    engine = make_engine(max_num_batched_tokens=48, max_num_seqs=4)
    out = {i: [] for i in range(len(prompts))}
    pending = list(enumerate(prompts))
    for _ in range(500):
        if pending:  # one new request every step while others decode
            i, p = pending.pop(0)
            engine.add_request(str(i), p, GREEDY)
        if not pending and not engine.has_unfinished():
            break
        for o in engine.step():
            out[int(o.request_id)].extend(o.new_token_ids)
    assert [out[i] for i in range(len(prompts))] == alone


def test_paged_cache_matches_contiguous_reference(make_engine, tiny_llama) -> None:
    """Blocks handed out in scrambled order: the paged gather must still equal HF's
    contiguous KV cache."""
    engine = make_engine(enable_prefix_caching=False)
    free = list(engine.block_manager.free)
    random.Random(7).shuffle(free)
    engine.block_manager.free.clear()
    engine.block_manager.free.extend(free)
    prompts = _prompts(3, seed=5)
    got = engine.generate(prompts, GREEDY)
    for prompt, tokens in zip(prompts, got):
        assert tokens == hf_greedy(tiny_llama, prompt, GREEDY.max_tokens)
    assert any(b2 != b1 + 1 for b1, b2 in zip(free, free[1:]))


def test_static_scheduling_runs_batches_to_completion(make_engine) -> None:
    prompts = _prompts()
    alone = _alone(make_engine, prompts)
    engine = make_engine(scheduling="static", max_num_seqs=3, max_num_batched_tokens=64)
    for i, p in enumerate(prompts):
        engine.add_request(str(i), p, GREEDY)
    out = {i: [] for i in range(len(prompts))}
    batches, previous = [], set()
    for _ in range(1000):
        if not engine.has_unfinished():
            break
        for o in engine.step():
            out[int(o.request_id)].extend(o.new_token_ids)
        running = {s.request_id for s in engine.scheduler.running}
        joined = running - previous
        # a request joins only when the previous batch has completely finished
        assert not joined or not (previous & running), (previous, running)
        if joined:
            batches.append(joined)
        previous = running
    assert [out[i] for i in range(len(prompts))] == alone
    assert [len(b) for b in batches] == [3, 3, 2]


def test_preemption_by_recompute_gives_identical_tokens(make_engine) -> None:
    prompts = _prompts(8, seed=11)
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    alone = _alone(make_engine, prompts, params)
    # 14 blocks of 16 tokens: all 8 sequences fit at admission, not while they grow.
    engine = make_engine(kv_cache_memory_gib=14 * 8192 / 2**30)
    assert engine.block_manager.num_blocks == 14
    assert engine.generate(prompts, params) == alone
    assert engine.stats().preemptions_total > 0


def test_prefix_cache_hit_gives_identical_tokens(make_engine) -> None:
    shared = _prompts(1, seed=2)[0] * 3  # long shared "system prompt"
    a, b = shared + [5, 6, 7], shared + [9, 10]
    reference = _alone(make_engine, [a, b])
    engine = make_engine()
    first = engine.generate([a], GREEDY)[0]
    tokens, cached = run_alone(engine, "b", b, GREEDY)
    assert [first, tokens] == reference
    assert cached == (len(shared) // 16) * 16 > 0


def test_prefix_cache_within_one_batch_and_across_chunks(make_engine) -> None:
    """Identical prompts admitted together while the first is still being prefilled in
    chunks: a block is only shared once its K/V is written."""
    prompt = _prompts(1, seed=4)[0] * 2
    reference = _alone(make_engine, [prompt])[0]
    engine = make_engine(max_num_batched_tokens=20)
    assert engine.generate([prompt] * 4, GREEDY) == [reference] * 4


def test_abort_frees_blocks_at_once(make_engine) -> None:
    engine = make_engine()
    engine.add_request("a", list(range(3, 70)), GREEDY)
    engine.add_request("b", list(range(3, 40)), GREEDY)
    engine.step()
    engine.step()
    assert engine.block_manager.num_used > 0
    out = engine.abort_request("a")
    assert out.finished and out.finish_reason == "abort" and out.timings is not None
    assert engine.stats().running == 1
    engine.abort_request("b")
    assert engine.block_manager.num_used == 0
    assert engine.abort_request("b") is None
    assert not engine.has_unfinished()


def test_waiting_when_cache_full_never_crashes(make_engine) -> None:
    """More demand than blocks: requests wait for admission instead of failing."""
    engine = make_engine(kv_cache_memory_gib=6 * 8192 / 2**30)
    prompts = [list(range(3, 60))] * 5  # 4 blocks each at admission; only one fits
    out = engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0,
                                                  ignore_eos=True))
    assert all(len(t) == 8 for t in out)


def test_stats_count_tokens(make_engine) -> None:
    engine = make_engine()
    engine.generate(_prompts(2), GREEDY)
    s = engine.stats()
    assert s.generation_tokens_total == 2 * GREEDY.max_tokens
    assert s.prompt_tokens_total == sum(map(len, _prompts(2)))
    assert s.kv_blocks_used == 0 and s.running == 0 and s.waiting == 0
    assert s.attention_kernel.startswith("cpu_")
    assert torch.get_num_threads() >= 1


def test_small_token_budget_never_starves_decodes(make_engine) -> None:
    """max_num_batched_tokens below max_num_seqs: at most budget sequences run, and each
    running sequence decodes every step."""
    engine = make_engine(max_num_batched_tokens=4, max_num_seqs=64)
    steps = []
    engine.step_observer = steps.append
    prompts = _prompts(6, seed=9)
    assert engine.generate(prompts, GREEDY) == _alone(make_engine, prompts)
    assert max(s.batch_size for s in steps) <= 4
