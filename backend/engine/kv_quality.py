"""KV-cache quantisation quality: perplexity and greedy agreement of int8 / fp8_e4m3 caches
against the full-precision cache, on a text the repo ships (backend/data/kv_eval.txt).

    python -m backend.engine.kv_quality [--model smollm2-135m-instruct] [--json PATH]

Every figure goes through the paged cache: ``LLMEngine.score`` writes K/V to the cache and
reads it back (quantised on write, dequantised on read) for every attention call.
"""
from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
import torch.nn.functional as F

from backend.engine._tools import emit_json
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams

EVAL_TEXT = Path(__file__).resolve().parent.parent / "data" / "kv_eval.txt"
KV_DTYPES = ("auto", "int8", "fp8_e4m3")
_DENSE = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
PROMPTS = ("What is the capital of France?", "Write a short poem about the sea.",
           "Explain what a KV cache is in one paragraph.", "List three uses of copper.")


def _engines(source, kv_dtypes, dtype: str = "float32",
             attention: str = "auto") -> dict[str, LLMEngine]:
    """One engine per KV dtype, all sharing the first one's model weights. The model runs
    in float32 so the baseline is the full-precision cache."""
    engines: dict[str, LLMEngine] = {}
    for kv in kv_dtypes:
        model = next(iter(engines.values())).runner.model if engines else None
        # Dense weights in the model dtype: only the cache differs between the engines.
        cfg = EngineConfig(kv_cache_dtype=kv, kv_cache_memory_gib=0.25, dtype=dtype,
                           weights_dtype=_DENSE[dtype], max_model_len=2048,
                           attention=attention)
        engines[kv] = LLMEngine(cfg, source, model=model)
    return engines


def perplexity_figures(source, text: str, kv_dtypes=KV_DTYPES,
                       max_tokens: int | None = None, attention: str = "auto") -> dict[str, dict]:
    """Per KV dtype: perplexity, and top-1 agreement / mean KL against the first dtype."""
    return compare_perplexity(_engines(source, kv_dtypes, attention=attention),
                              source.tokenizer, text, max_tokens)


def compare_perplexity(engines: dict[str, LLMEngine], tokenizer, text: str,
                       max_tokens: int | None = None, chunk: int | None = None
                       ) -> dict[str, dict]:
    """Per engine variant: perplexity of ``text``, and top-1 agreement / mean KL /
    perplexity change against the first variant (``chunk``: ``LLMEngine.score``'s)."""
    tokens = tokenizer.encode(text)[:max_tokens]
    target = torch.tensor(tokens[1:])
    logits, out = {}, {}
    for name, engine in engines.items():
        logits[name] = engine.score(tokens, chunk)[:-1].float().cpu()  # [T-1, V]
        nll = F.cross_entropy(logits[name], target).item()
        out[name] = {"tokens": len(tokens), "perplexity": math.exp(nll)}
    first = next(iter(engines))
    base = logits[first]
    ref_logp = F.log_softmax(base, -1)
    for name in engines:
        logp = F.log_softmax(logits[name], -1)
        out[name]["top1_agreement"] = (logits[name].argmax(-1) == base.argmax(-1)
                                       ).float().mean().item()
        out[name]["mean_kl_vs_full"] = F.kl_div(logp, ref_logp, log_target=True,
                                                reduction="batchmean").item()
        out[name]["perplexity_change_pct"] = 100 * (out[name]["perplexity"]
                                                    / out[first]["perplexity"] - 1)
    return out


def greedy_agreement(source, prompts=PROMPTS, max_tokens: int = 64,
                     kv_dtypes=KV_DTYPES, attention: str = "auto") -> dict[str, dict]:
    """Greedy continuations of chat prompts: identical ones, and matching positions."""
    return compare_greedy(_engines(source, kv_dtypes, attention=attention), source.tokenizer,
                          prompts, max_tokens)


def compare_greedy(engines: dict[str, LLMEngine], tok, prompts=PROMPTS,
                   max_tokens: int = 64) -> dict[str, dict]:
    """Greedy continuations of chat prompts per engine variant against the first one:
    identical continuations, and the mean matching prefix."""
    ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}]))
           for p in prompts]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    runs = {name: e.generate(ids, params) for name, e in engines.items()}
    base, out = runs[next(iter(engines))], {}
    for name in engines:
        same = sum(a == b for a, b in zip(runs[name], base))
        prefix = [_common_prefix(a, b) for a, b in zip(runs[name], base)]
        out[name] = {"prompts": len(ids), "tokens_each": max_tokens, "identical": same,
                     "mean_common_prefix": sum(prefix) / len(prefix)}
    return out


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    ap.add_argument("--attention", default="auto",
                    help="attention backend of every engine (triton on the CPU needs "
                         "TRITON_INTERPRET=1: the kernels' own quantised reads, slowly)")
    ap.add_argument("--skip-greedy", action="store_true", help="perplexity figures only")
    args = ap.parse_args(argv)
    from backend.weights.loader import load_model_source

    source = load_model_source(args.model)
    result = {"model": source.name, "text": str(EVAL_TEXT.name), "attention": args.attention,
              "perplexity": perplexity_figures(source, EVAL_TEXT.read_text(),
                                               attention=args.attention)}
    if not args.skip_greedy:
        result["greedy"] = greedy_agreement(source, attention=args.attention)
    emit_json(result, args.json)


if __name__ == "__main__":
    main()
