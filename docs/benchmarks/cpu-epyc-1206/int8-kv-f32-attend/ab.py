"""A/B in one process: the CPU engine with an int8 KV cache (SmolLM2, the CPU defaults
otherwise) attending its dequantised context in float32 where a step's decode rows gather
``attention.F32_DECODE_MIN_TOKENS`` tokens or more ("f32": now) or always rounded to bf16
first as the tree before did ("bf16-attend": its ``_prepare_dense`` sets the model dtype
back, ``model_dtype_decodes``), two engines on one model, alternating round by round, the
order swapped every round; the bf16 cache ("bf16") beside them. Per round and engine: the
mean decode step of ``batch`` sequences with PROMPT-token prompts over 32 steps after their
prefills (``int8-kv-rows/ab.alternate``). The first runs (``always/``) attended every
decode step in float32, with the threshold at 1.

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int8-kv-f32-attend/ab.py \
        [ROUNDS] [BATCHES] [PROMPT]
"""
import json
import os
import sys

import torch

from backend.engine.llm_engine import LLMEngine
from backend.layers import attention

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "int8-kv-rows"))
from ab import alternate, arguments, three_engines  # noqa: E402  (the int8-kv-rows A/B)


def model_dtype_decodes(engine: LLMEngine) -> None:
    """The engine's decode rows attend in the model dtype whatever they gather."""
    attn = engine.runner.attn
    prepare = attn._prepare_dense

    def before(meta: attention.AttentionMetadata) -> None:
        prepare(meta)
        if "decode" in meta.extra:
            idx, mask, _ = meta.extra["decode"]
            dt = attn.kv_cache.model_dtype
            meta.extra["decode"] = (idx, None if mask is None else mask.to(dt), dt)

    attn._prepare_dense = before


def main() -> None:
    rounds, batches, prompt = arguments()
    f32, before, bf16 = three_engines()
    assert f32.runner.dtype == torch.bfloat16 and attention.F32_DECODE_MIN_TOKENS == 1024
    model_dtype_decodes(before)
    engines = {"f32": f32, "bf16-attend": before, "bf16": bf16}
    print(json.dumps(alternate(engines, rounds, batches, prompt)))


if __name__ == "__main__":
    main()
