"""int8 / fp8_e4m3 KV cache: round-trip error bounds, and on SmolLM2 the perplexity change
and greedy agreement against the full-precision cache (figures in docs/benchmarks/engine.md)."""
from __future__ import annotations

import pytest
import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.layers.attention import Attention
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


@pytest.mark.parametrize("kind", ["int8", "fp8_e4m3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_torch_layout_reads_back_as_the_kernels_layout_does(kind: str,
                                                                 dtype: torch.dtype) -> None:
    """The torch path's cache keeps int8 V in rows and the scales per token; the Triton
    kernels' cache transposes int8 V within each block and keeps the scales per head: the
    same writes (two steps, the second overwriting slots of the first) read back the same
    values from both, the same codes and scales sit in other places, and the Triton backend
    refuses the torch layout."""
    caches = [KVCache(2, 4, 16, 3, 64, dtype, kind, torch.device("cpu"), kernel_layout=t)
              for t in (True, False)]
    assert [c.v_transposed for c in caches] == [kind == "int8", False]
    assert caches[0].scales.shape == (2, 2, 3, 80) and caches[1].scales.shape == (2, 80, 2, 3)
    kv = (torch.randn(40, 2, 3, 64) * torch.logspace(-2, 1, 40).view(40, 1, 1, 1)).to(dtype)
    slots = torch.cat((torch.arange(16, 48), torch.tensor([3, 60, 61, 5, 50, 7, 0, 9])))
    for c in caches:
        c.write(1, slots, kv[:, 0], kv[:, 1])
        c.write(1, slots[:5], kv[:5, 1], kv[:5, 0])  # a later step's tokens in slots 16-20
    idx = torch.randperm(64)
    back = caches[1].gather(1, idx)
    assert back.dtype == dtype and back.shape == (64, 2, 3, 64)
    assert torch.equal(caches[0].gather(1, idx), back)
    assert torch.equal(caches[0].scales[1].permute(2, 0, 1), caches[1].scales[1])
    assert torch.equal(caches[0].data[:, :, 0], caches[1].data[:, :, 0])  # K: rows in both
    assert torch.equal(caches[0].data[:, :, 1], caches[1].data[:, :, 1]) == (kind != "int8")
    assert caches[1].gather(0, idx).abs().max() == 0  # the other layer untouched
    with pytest.raises(ValueError, match="kernels' layout"):
        Attention(9, 3, 64, "triton", caches[1])
    # a bf16 cache has no scales and no transposed V: either layout serves the kernels
    Attention(9, 3, 64, "triton", KVCache(1, 4, 16, 3, 64, torch.bfloat16, "auto",
                                          torch.device("cpu"), kernel_layout=False))


@pytest.mark.parametrize("attention", ["sdpa", "math"])
def test_the_engine_keeps_int8_v_in_rows_for_the_torch_attention(smollm2_source,
                                                                  attention: str) -> None:
    engine = LLMEngine(EngineConfig(device="cpu", kv_cache_dtype="int8", attention=attention,
                                    max_model_len=256, kv_cache_memory_gib=0.05,
                                    cpu_aot_kernels="off"), smollm2_source)
    assert engine.runner.kv_cache.v_transposed is False
    assert engine.runner.kv_cache.kernel_layout is False


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
