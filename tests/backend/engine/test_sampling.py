"""Sampling: seeds, temperature/top-k/top-p, min_tokens, ignore_eos, stop ids, max_tokens."""
from __future__ import annotations

import pytest
import torch

from backend.engine import sampler as sampler_module
from backend.engine.sampler import Sampler, exponential_race, inverse_cdf
from backend.engine.sampling import SamplingParams
from backend.engine.sequence import Sequence

PROMPT = list(range(10, 40))


def _run(engine, params: SamplingParams, prompt=PROMPT):
    engine.add_request("r", prompt, params)
    tokens, last = [], None
    while engine.has_unfinished():
        for o in engine.step():
            tokens.extend(o.new_token_ids)
            last = o
    return tokens, last


def test_seed_reproducible_alone_and_in_a_batch(make_engine) -> None:
    params = SamplingParams(max_tokens=20, temperature=1.0, seed=1234, ignore_eos=True)
    engine = make_engine()
    a = engine.generate([PROMPT], params)[0]
    b = engine.generate([PROMPT], params)[0]
    others = SamplingParams(max_tokens=20, temperature=0.8, top_p=0.9, ignore_eos=True)
    batch = engine.generate([PROMPT[:7], PROMPT, PROMPT[3:]], [others, params, others])
    assert a == b == batch[1]
    c = engine.generate([PROMPT], SamplingParams(max_tokens=20, temperature=1.0, seed=99,
                                                 ignore_eos=True))[0]
    assert c != a


def test_temperature_sampling_differs_from_greedy(make_engine) -> None:
    engine = make_engine()
    greedy = engine.generate([PROMPT], SamplingParams(max_tokens=20, temperature=0.0,
                                                      ignore_eos=True))[0]
    hot = engine.generate([PROMPT], SamplingParams(max_tokens=20, temperature=5.0, seed=3,
                                                   ignore_eos=True))[0]
    assert hot != greedy


def test_tiny_temperature_is_greedy(make_engine) -> None:
    # 7e-207 is 0 in float32: dividing the logits by it made NaN probabilities
    engine = make_engine()
    greedy = engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0.0,
                                                      ignore_eos=True))[0]
    for t in (7.006746489862513e-207, 1e-6):
        params = SamplingParams(max_tokens=8, temperature=t, ignore_eos=True)
        assert params.greedy
        assert engine.generate([PROMPT], params)[0] == greedy
    assert not SamplingParams(temperature=1e-5).greedy


def _seq(params: SamplingParams) -> Sequence:
    return Sequence("x", [1, 2, 3], 3, params)


def test_top_k_and_top_p_restrict_the_support() -> None:
    sampler = Sampler((0,), torch.device("cpu"))
    logits = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0]])
    top2 = [_seq(SamplingParams(temperature=1.0, top_k=2))]
    seen = {int(sampler.sample(logits.clone(), top2)) for _ in range(200)}
    assert seen == {3, 4}
    # softmax([0..4]) top mass 0.636 + 0.234 = 0.87 < 0.9 < +0.086: top_p 0.9 keeps 3 tokens
    top_p = [_seq(SamplingParams(temperature=1.0, top_p=0.9))]
    seen = {int(sampler.sample(logits.clone(), top_p)) for _ in range(300)}
    assert seen == {2, 3, 4}


def test_min_tokens_masks_eos_and_ignore_eos_runs_to_max(make_engine) -> None:
    engine = make_engine()
    free_run, _ = _run(engine, SamplingParams(max_tokens=12, temperature=0.0,
                                              ignore_eos=True))
    # Make the model's 3rd greedy token the EOS of a fresh engine's tokenizer.
    eos = free_run[2]
    engine.eos = frozenset({eos})
    engine.runner.sampler.eos = (eos,)
    stopped, last = _run(engine, SamplingParams(max_tokens=12, temperature=0.0))
    assert stopped == free_run[:2] and last.finish_reason == "stop" and last.finished
    ignored, last = _run(engine, SamplingParams(max_tokens=12, temperature=0.0,
                                                ignore_eos=True))
    assert ignored == free_run and last.finish_reason == "length"
    held, last = _run(engine, SamplingParams(max_tokens=12, temperature=0.0, min_tokens=6))
    assert len(held) >= 6 and eos not in held[:6]
    assert held[:2] == free_run[:2] and held[2] != eos


def test_stop_token_ids_end_the_request(make_engine) -> None:
    engine = make_engine()
    free_run, _ = _run(engine, SamplingParams(max_tokens=12, temperature=0.0,
                                              ignore_eos=True))
    stop = free_run[4]
    first = free_run.index(stop)
    tokens, last = _run(engine, SamplingParams(max_tokens=12, temperature=0.0,
                                               ignore_eos=True, stop_token_ids=(stop,)))
    assert tokens == free_run[:first]  # the stop token itself is not content
    assert last.finish_reason == "stop"


def test_max_tokens_and_context_limit_give_length(make_engine) -> None:
    engine = make_engine(max_model_len=40)
    tokens, last = _run(engine, SamplingParams(max_tokens=5, temperature=0.0,
                                               ignore_eos=True))
    assert len(tokens) == 5 and last.finish_reason == "length"
    tokens, last = _run(engine, SamplingParams(max_tokens=100, temperature=0.0,
                                               ignore_eos=True))
    assert len(PROMPT) + len(tokens) == 40 and last.finish_reason == "length"
    assert last.timings is not None and last.timings.e2e_s >= last.timings.first_token_s


@pytest.mark.parametrize("bad", [dict(max_tokens=0), dict(temperature=-1.0), dict(top_p=0.0),
                                 dict(top_p=1.5), dict(top_k=-1), dict(min_tokens=-1)])
def test_sampling_params_validation(bad) -> None:
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_sampling_params_from_dict_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match="best_of"):
        SamplingParams.from_dict({"max_tokens": 3, "best_of": 2})
    assert SamplingParams.from_dict({"stop_token_ids": [5, 6]}).stop_token_ids == (5, 6)




def test_filtered_tokens_never_sampled_even_with_zero_noise(monkeypatch) -> None:
    """argmax(p / E) (the GPU's draw): a zero exponential draw on a filtered token must not
    win."""
    probs = torch.tensor([[0.0, 0.0, 0.0, 0.0, 1.0]])  # top_k = 1 of [0, 1, 2, 3, 4]
    monkeypatch.setattr(torch.Tensor, "exponential_",
                        lambda self, generator=None: self.zero_())
    assert int(exponential_race(probs, [None], torch.Generator())[0]) == 4


@pytest.mark.parametrize("u", [0.0, 0.5, 1.0])
def test_inverse_cdf_never_lands_on_a_filtered_token(u, monkeypatch) -> None:
    """The CPU's draw at both ends of U (1.0 stands for a draw that rounds up to the total):
    filtered tokens before, between and after the kept ones are never picked."""
    monkeypatch.setattr(sampler_module, "uniform_rows",
                        lambda n, generator, device: torch.full((n, 1), u))
    sampler = Sampler((0,), torch.device("cpu"))
    for logits, kept in (([0.0, 1.0, 2.0, 3.0, 4.0], {4}), ([4.0, 3.0, 2.0, 1.0, 0.0], {0}),
                         ([0.0, 4.0, 1.0, 4.0, 0.0], {1, 3})):
        seqs = [_seq(SamplingParams(temperature=1.0, top_k=len(kept)))]
        assert int(sampler.sample(torch.tensor([logits]), seqs)) in kept, (logits, u)


@pytest.mark.parametrize("draw", [inverse_cdf, exponential_race])
def test_sampled_frequencies_follow_the_softmax(draw) -> None:
    """Both draws pick token i with probability p_i: 4,000 draws of four tokens land within
    0.03 of the distribution (a draw skewed to the mode, or uniform, would not)."""
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4]).expand(4000, 4).contiguous()
    drawn = draw(probs, [None] * 4000, torch.Generator().manual_seed(0))
    freq = torch.bincount(drawn, minlength=4).float() / 4000
    assert torch.allclose(freq, probs[0], atol=0.03), freq


def test_the_sampler_on_the_cpu_follows_the_softmax() -> None:
    sampler = Sampler((0,), torch.device("cpu"))
    probs = torch.tensor([0.1, 0.2, 0.3, 0.4])
    logits = probs.log().unsqueeze(0).expand(4000, 4).contiguous()
    seqs = [_seq(SamplingParams(temperature=1.0)) for _ in range(4000)]
    freq = torch.bincount(sampler.sample(logits, seqs), minlength=4).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03), freq


def test_out_of_vocab_stop_ids_are_ignored_by_the_mask() -> None:
    sampler = Sampler((0,), torch.device("cpu"))
    logits = torch.tensor([[5.0, 1.0, 2.0]])
    seqs = [_seq(SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=(99,)))]
    assert int(sampler.sample(logits, seqs)) == 2  # EOS 0 masked, 99 ignored
