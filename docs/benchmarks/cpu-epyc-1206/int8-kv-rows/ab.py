"""A/B in one process: the CPU engine with an int8 KV cache (SmolLM2, the CPU defaults
otherwise) keeping V in rows ("rows": the torch attention path's layout now, dequantised
from dense scales in place) or as the tree before read it ("transposed": V transposed
within each block as the Triton kernels read it, ``Before.gather`` the gather of that
tree), two engines on one model, alternating round by round, the order swapped every round;
the bf16 cache ("bf16") beside them. Per round and engine: the mean decode step of
``batch`` sequences with PROMPT-token prompts over 32 steps after their prefills
(``copy_ab.decode_ms``).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int8-kv-rows/ab.py [ROUNDS] [BATCHES] [PROMPT]
"""
import json
import os
import statistics
import sys

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.layers.kv_cache import KVCache
from backend.weights.loader import load_model_source

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "cpu-epyc-1205"))
from copy_ab import decode_ms  # noqa: E402


class Before(KVCache):
    """The cache's gather before the change: V through its transposed index, the scales
    strided, int8 times float32 in one multiply."""

    def gather(self, layer: int, idx: torch.Tensor) -> torch.Tensor:
        flat = idx.reshape(-1)
        kv = self.data[layer].index_select(0, flat)
        kv[:, 1] = self._v_rows(layer)[self._v_index(flat)].transpose(1, 2)
        scale = self.scales[layer].index_select(2, flat).permute(2, 0, 1)
        kv = (kv.float() * scale.unsqueeze(-1)).to(self.model_dtype)
        return kv.view(*idx.shape, *kv.shape[1:])


def use_before(eng: LLMEngine) -> KVCache:
    """Swaps the engine's int8 cache for a ``Before`` of the same shape (V transposed)."""
    c = eng.runner.kv_cache
    t = Before(c.data.shape[0], c.num_blocks, c.block_size, c.data.shape[3], c.data.shape[4],
               c.model_dtype, "int8", c.data.device, kernel_layout=True)
    eng.runner.kv_cache = eng.runner.attn.kv_cache = t
    return t


def main() -> None:
    rounds, batches, prompt = arguments()
    rows, transposed, bf16 = three_engines()
    t = use_before(transposed)
    engines = {"rows": rows, "transposed": transposed, "bf16": bf16}
    assert rows.runner.kv_cache.v_transposed is False and t.v_transposed is True
    print(json.dumps(alternate(engines, rounds, batches, prompt)))


def arguments() -> tuple[int, list[int], int]:
    """[ROUNDS] [BATCHES] [PROMPT] from the command line."""
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,4,8,32").split(",")]
    prompt = int(sys.argv[3]) if len(sys.argv) > 3 else 256
    return rounds, batches, prompt


def three_engines() -> tuple[LLMEngine, LLMEngine, LLMEngine]:
    """Two int8 K/V engines and a bf16 K/V one on one SmolLM2 model (CPU defaults)."""
    src = load_model_source("smollm2-135m-instruct")
    cfg = dict(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
               enable_prefix_caching=False)
    first = LLMEngine(EngineConfig(kv_cache_dtype="int8", **cfg), src)
    model = first.runner.model
    return (first, LLMEngine(EngineConfig(kv_cache_dtype="int8", **cfg), src, model=model),
            LLMEngine(EngineConfig(kv_cache_dtype="auto", **cfg), src, model=model))


def alternate(engines: dict[str, LLMEngine], rounds: int, batches: list[int],
              prompt: int) -> dict:
    """Each round every engine in turn (the order reversed every other round) decodes each
    batch: the mean step over 32 steps after PROMPT-token prompts; the samples, their
    medians and the load before and after."""
    out = {"load_start": os.getloadavg(), "prompt_tokens": prompt, "samples": {}}
    for eng in engines.values():
        decode_ms(eng, 4, 4, 32)  # warm-up
    order = list(engines)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            s = out["samples"].setdefault(name, {})
            for b in batches:
                s.setdefault(f"step_ms_batch{b}", []).append(round(decode_ms(engines[name], b,
                                                                               32, prompt), 2))
            print(r, name, {k: v[-1] for k, v in s.items()}, file=sys.stderr, flush=True)
    out["medians"] = {n: {k: statistics.median(v) for k, v in s.items()}
                      for n, s in out["samples"].items()}
    out["load_end"] = os.getloadavg()
    return out


if __name__ == "__main__":
    main()
