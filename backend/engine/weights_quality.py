"""Weight quantisation quality: perplexity and top-1 / greedy agreement of int8 and int4
(per group size) linear weights against dense weights, on the text the repo ships
(backend/data/kv_eval.txt, and any ``--text`` files), with the figures of ``kv_quality``.

    python -m backend.engine.weights_quality [--model smollm2-135m-instruct] \\
        [--variants bf16,int8,int8/none,int4:32,int4:64,auto] [--dtype bfloat16] \\
        [--text README.md --text docs/ARCHITECTURE.md] [--json PATH]

A variant is a ``--weights-dtype`` value, ``int4:G`` for a group size, optionally
``+head`` (the LM head quantised the same way; ``+head=int8``: as int8), ``/none``
(``--weights-scaling none``: plain rounding instead of activation-aware scales) and
``@model`` / ``@int8`` / ``@int8x2`` (``--cpu-int4-activations``; default the engine's,
int8x2); the first one is the reference. A prefill of many rows multiplies by the layers' dense copies; ``--score-chunk
8`` feeds the texts 8 tokens a pass, so the scores go through the kernels of decode steps
(the int4 x int8 op among them) instead. Group
sizes that do not divide a layer's input width are reported as skipped. With ``--text``,
each file is scored too (at most ``--max-tokens`` tokens each) and ``pooled`` gives the
top-1 agreement and mean KL over every scored position of every text.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from backend.engine._tools import emit_json
from backend.engine.config import EngineConfig
from backend.engine.kv_quality import EVAL_TEXT, compare_greedy, compare_perplexity
from backend.engine.llm_engine import LLMEngine
from backend.engine.model_runner import resolve_dtype
from backend.layers.kv_cache import bytes_per_block

DEFAULT_VARIANTS = "bf16,int8,int8/none,int4:32,int4:64,int4:64/none,int4:128,auto,int8+head"


def variant_config(variant: str, dtype: str, device: str = "cpu",
                   max_model_len: int = 2048, kv_gib: float = 0.25) -> EngineConfig:
    """'int4:64+head/none' -> EngineConfig(weights_dtype='int4', int4_group_size=64,
    lm_head_dtype='int4', weights_scaling='none'); 'auto+head=int8': an int8 head;
    'auto@model': cpu_int4_activations='model'."""
    variant, _, activations = variant.partition("@")
    variant, _, scaling = variant.partition("/")
    name, _, head = variant.partition("+")
    weights, _, group = name.partition(":")
    lm_head = (head.partition("=")[2] or weights) if head.startswith("head") else "model"
    return EngineConfig(device=device, dtype=dtype, weights_dtype=weights,
                        int4_group_size=int(group or 32), lm_head_dtype=lm_head,
                        weights_scaling=scaling or "activation",
                        **({"cpu_int4_activations": activations} if activations else {}),
                        kv_cache_memory_gib=kv_gib, max_model_len=max_model_len)


def kv_room_gib(cfg, tokens: int, dtype: str, device: str = "cpu") -> float:
    """GiB of K/V (model dtype) that hold one context of ``tokens``; at least 0.25."""
    block = EngineConfig().block_size
    per_block = bytes_per_block(cfg.num_hidden_layers, block, cfg.num_key_value_heads,
                                cfg.head_dim, "auto", resolve_dtype(dtype, torch.device(device)))
    return max(0.25, (tokens // block + 1) * per_block / 2**30)


def build_engines(source, variants: list[str], dtype: str, device: str = "cpu"
                  ) -> tuple[dict[str, LLMEngine], dict[str, str]]:
    """One engine per variant that the model's shapes allow; the others with the reason.
    Contexts of up to 2048 tokens, or the model's own limit where it is shorter, with K/V
    room for one such context (at least 0.25 GiB)."""
    engines, skipped = {}, {}
    max_len = min(2048, source.config.max_position_embeddings)
    kv_gib = kv_room_gib(source.config, max_len, dtype, device)
    for v in variants:
        try:
            engines[v] = LLMEngine(variant_config(v, dtype, device, max_len, kv_gib), source)
        except ValueError as exc:  # e.g. a group size that does not divide 576
            skipped[v] = str(exc)
    if not engines:
        raise SystemExit(f"no variant runs on {source.name}: {skipped}")
    return engines, skipped


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--variants", default=DEFAULT_VARIANTS)
    ap.add_argument("--dtype", default="bfloat16", help="model (activation) dtype")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-tokens", type=int, default=None,
                    help="score at most this many tokens of each text")
    ap.add_argument("--text", type=Path, action="append", default=[],
                    help="another text to score (repeatable); pooled figures cover all")
    ap.add_argument("--greedy-tokens", type=int, default=64)
    ap.add_argument("--score-chunk", type=int, default=None, metavar="N",
                    help="score N tokens a forward pass (1-8: the kernels of decode steps)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    from backend.weights.loader import load_model_source

    source = load_model_source(args.model)
    engines, skipped = build_engines(source, args.variants.split(","), args.dtype,
                                     args.device)
    stats = {v: e.stats() for v, e in engines.items()}
    formats = {v: s.weights_format + " / head " + s.lm_head_format for v, s in stats.items()}
    scaling = {v: s.weights_scaling for v, s in stats.items()}
    per_text = {str(t): compare_perplexity(engines, source.tokenizer, t.read_text(),
                                           args.max_tokens, args.score_chunk)
                for t in [EVAL_TEXT, *args.text]}
    result = {"model": source.name, "text": EVAL_TEXT.name, "dtype": args.dtype,
              "reference": next(iter(engines)), "formats": formats, "scaling": scaling,
              "skipped": skipped, "score_chunk": args.score_chunk,
              "int4_w4a8": {v: s.cpu_aot_kernels.get("int4_w4a8", {}).get("status")
                            for v, s in stats.items()},
              "perplexity": per_text.pop(str(EVAL_TEXT)),
              "greedy": compare_greedy(engines, source.tokenizer,
                                       max_tokens=args.greedy_tokens)}
    if args.text:
        result["more_text"] = per_text
        result["pooled"] = pooled([result["perplexity"], *per_text.values()])
    emit_json(result, args.json)


def pooled(figures: list[dict[str, dict]]) -> dict[str, dict]:
    """Per variant: top-1 agreement and mean KL over every scored position of the texts
    (each text's figures weighted by its positions)."""
    out = {}
    for variant in figures[0]:
        n = [f[variant]["tokens"] - 1 for f in figures]
        out[variant] = {
            "positions": sum(n),
            "top1_agreement": sum(k * f[variant]["top1_agreement"]
                                  for k, f in zip(n, figures)) / sum(n),
            "mean_kl_vs_full": sum(k * f[variant]["mean_kl_vs_full"]
                                   for k, f in zip(n, figures)) / sum(n)}
    return out


if __name__ == "__main__":
    main()
