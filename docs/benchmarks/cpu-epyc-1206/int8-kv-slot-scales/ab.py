"""A/B in one process: the CPU engine with an int8 KV cache (SmolLM2, the CPU defaults
otherwise) keeping its scales per token and quantising a step's K and V together ("slot":
the torch attention path's layout now) or as the tree before did ("head": V in rows, the
scales per head as the Triton kernels read them, gathered then permuted into a dense copy,
K and V quantised and written one after the other: ``Head``), two engines on one model,
alternating round by round, the order swapped every round; the bf16 cache ("bf16") beside
them. Per round and engine: the mean decode step of ``batch`` sequences with PROMPT-token
prompts over 32 steps after their prefills (``int8-kv-rows/ab.alternate``).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int8-kv-slot-scales/ab.py \
        [ROUNDS] [BATCHES] [PROMPT]
"""
import json
import os
import sys

import torch

from backend.layers.kv_cache import KVCache, quantise

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "int8-kv-rows"))
from ab import alternate, arguments, three_engines  # noqa: E402  (the int8-kv-rows A/B)


class Head(KVCache):
    """The tree before: V in rows, scales [layers, 2, kvh, slots], K and V apart."""

    def __init__(self, *args) -> None:
        super().__init__(*args, kernel_layout=True)
        self.v_transposed = False

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        for c, x in enumerate((k, v)):
            q, scale = quantise(x, self.kv_cache_dtype)
            self.data[layer, :, c].index_copy_(0, slots, q)
            self.scales[layer, c].index_copy_(1, slots, scale.t())


def main() -> None:
    rounds, batches, prompt = arguments()
    slot, head, bf16 = three_engines()
    c = head.runner.kv_cache
    h = Head(c.data.shape[0], c.num_blocks, c.block_size, c.data.shape[3], c.data.shape[4],
             c.model_dtype, "int8", c.data.device)
    head.runner.kv_cache = head.runner.attn.kv_cache = h
    engines = {"slot": slot, "head": head, "bf16": bf16}
    assert slot.runner.kv_cache.kernel_layout is False and h.scales.shape[1] == 2
    print(json.dumps(alternate(engines, rounds, batches, prompt)))


if __name__ == "__main__":
    main()
