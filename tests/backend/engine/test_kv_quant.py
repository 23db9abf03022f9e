"""int8 / fp8_e4m3 KV cache: round-trip error bounds, and on SmolLM2 the perplexity change
and greedy agreement against the full-precision cache (figures in docs/benchmarks/engine.md)."""
from __future__ import annotations

import pytest
import torch

from backend.layers.kv_cache import KVCache
from backend.engine.kv_quality import EVAL_TEXT, greedy_agreement, perplexity_figures


@pytest.mark.parametrize("kind,rel_err", [("int8", 1 / 127), ("fp8_e4m3", 1 / 16)])
def test_quantised_round_trip_within_format_precision(kind: str, rel_err: float) -> None:
    cache = KVCache(num_layers=2, num_blocks=4, block_size=16, num_kv_heads=3, head_dim=64,
                    model_dtype=torch.float32, kv_cache_dtype=kind, device=torch.device("cpu"))
    kv = torch.randn(20, 2, 3, 64) * torch.logspace(-3, 2, 20).view(20, 1, 1, 1)
    slots = torch.randperm(64)[:20]
    cache.write(1, slots, kv[:, 0], kv[:, 1])
    back = cache.gather(1, slots)
    amax = kv.abs().amax(dim=-1, keepdim=True)  # per token, K/V and head
    assert ((back - kv).abs() <= amax * rel_err + 1e-12).all()
    assert cache.gather(0, slots).abs().max() == 0  # other layer untouched


def test_int8_and_fp8_quality_on_smollm2(smollm2_source) -> None:
    ppl = perplexity_figures(smollm2_source, EVAL_TEXT.read_text(), max_tokens=320)
    assert 5 < ppl["auto"]["perplexity"] < 100  # the model reads this text sensibly
    assert abs(ppl["int8"]["perplexity_change_pct"]) < 1.0
    assert abs(ppl["fp8_e4m3"]["perplexity_change_pct"]) < 3.0
    assert ppl["int8"]["top1_agreement"] > 0.95
    assert ppl["fp8_e4m3"]["top1_agreement"] > 0.9
    greedy = greedy_agreement(smollm2_source, prompts=("What is the capital of France?",
                                                       "List three uses of copper."),
                              max_tokens=16)
    for kv in ("int8", "fp8_e4m3"):
        assert greedy[kv]["mean_common_prefix"] >= 6
