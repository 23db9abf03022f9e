"""What each way of rounding the linear weights costs, measured without a kernel: the dense
model's q|k|v, o, gate|up and down weights are replaced by their quantised-then-dequantised
values (fake quantisation, in the model dtype), one scheme at a time, and the text of
``kv_quality`` is scored against the unchanged weights (perplexity change, top-1 agreement,
mean KL). It separates the rounding itself from kernel numerics, and shows which layers and
which scale layouts the int8 losses come from.

    python -m backend.engine.weights_rounding [--model smollm2-135m-instruct] \\
        [--dtype float32] [--json PATH]

Schemes: int8 with one scale per output row (what ``--weights-dtype int8`` stores), the same
with an MSE-chosen clip, asymmetric per row, symmetric per group of G inputs, bf16 / fp16
rounding (the floor), per-row int8 applied to one layer kind at a time, and the e4m3 weights
of ``--weights-dtype fp8`` (its activation rounding left out: the difference to a
``weights_quality`` run of fp8 is what rounding the activations costs).
"""
from __future__ import annotations

import argparse
import math
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from backend.engine._tools import emit_json
from backend.engine.config import EngineConfig
from backend.engine.kv_quality import EVAL_TEXT
from backend.engine.llm_engine import LLMEngine
from backend.layers.quantize import (INT8_MAX, dequantize_fp8, dequantize_int8, quantize_fp8,
                                     quantize_int8)
from backend.weights.loader import load_model_source

LAYER_KINDS = ("qkv", "o", "gate_up", "down")
CLIPS = (1.0, 0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.6, 0.5)


def int8_row(w: torch.Tensor) -> torch.Tensor:
    """w [N, K] -> the values ``--weights-dtype int8`` multiplies by (float32)."""
    return dequantize_int8(*quantize_int8(w))


def int8_row_mse(w: torch.Tensor) -> torch.Tensor:
    """Per row, the clip of amax (of ``CLIPS``) with the least squared error."""
    w = w.float()
    amax = w.abs().amax(dim=1, keepdim=True)  # [N, 1]
    best, best_err = w.clone(), torch.full((w.shape[0],), math.inf)
    for clip in CLIPS:
        s = (amax * clip / INT8_MAX).clamp(min=1e-12)
        d = torch.round(w / s).clamp(-INT8_MAX, INT8_MAX) * s
        err = ((d - w) ** 2).sum(dim=1)
        better = err < best_err
        best[better], best_err[better] = d[better], err[better]
    return best


def int8_row_asym(w: torch.Tensor) -> torch.Tensor:
    """256 levels between each row's min and max (a zero point per row)."""
    w = w.float()
    lo, hi = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    s = ((hi - lo) / 255).clamp(min=1e-12)
    return torch.round((w - lo) / s) * s + lo


def int8_group(w: torch.Tensor, group: int) -> torch.Tensor:
    """Symmetric int8 with one scale per ``group`` inputs of a row."""
    N, K = w.shape
    g = w.float().view(N, K // group, group)
    s = (g.abs().amax(dim=-1, keepdim=True) / INT8_MAX).clamp(min=1e-12)
    return (torch.round(g / s).clamp(-INT8_MAX, INT8_MAX) * s).view(N, K)


def schemes() -> dict[str, tuple]:
    """name -> (rounding function, layer kinds it applies to)."""
    out = {"bf16 rounding": (lambda w: w.bfloat16().float(), LAYER_KINDS),
           "fp16 rounding": (lambda w: w.half().float(), LAYER_KINDS),
           "int8 per row (today)": (int8_row, LAYER_KINDS),
           "int8 per row, MSE clip": (int8_row_mse, LAYER_KINDS),
           "int8 per row, asymmetric": (int8_row_asym, LAYER_KINDS),
           # the weights of --weights-dtype fp8 alone (it rounds the activations too)
           "fp8 e4m3 per row": (lambda w: dequantize_fp8(*quantize_fp8(w)), LAYER_KINDS)}
    for g in (32, 64, 192):  # 192 divides 576 and 1536 (128 does not divide 576)
        out[f"int8 per group of {g}"] = (partial(int8_group, group=g), LAYER_KINDS)
    for kind in LAYER_KINDS:
        out[f"int8 per row, {kind} only"] = (int8_row, (kind,))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32", help="model dtype (dense weights in it)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    source = load_model_source(args.model)
    dense = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}[args.dtype]
    engine = LLMEngine(EngineConfig(dtype=args.dtype, weights_dtype=dense,
                                    kv_cache_memory_gib=0.25, max_model_len=2048), source)
    layers = engine.runner.model.layers
    tokens = source.tokenizer.encode(EVAL_TEXT.read_text())
    target = torch.tensor(tokens[1:])
    original = {(i, k): getattr(layer, k).weight.clone()
                for i, layer in enumerate(layers) for k in LAYER_KINDS}

    def score() -> torch.Tensor:
        return engine.score(tokens)[:-1].float()  # [T-1, V]

    base = score()
    base_nll = F.cross_entropy(base, target).item()
    ref_logp = F.log_softmax(base, -1)
    result = {"model": source.name, "text": EVAL_TEXT.name, "dtype": args.dtype,
              "tokens": len(tokens), "reference_perplexity": math.exp(base_nll), "schemes": {}}
    for name, (fn, kinds) in schemes().items():
        for (i, k), w in original.items():
            getattr(layers[i], k).weight.copy_(fn(w) if k in kinds else w)
        logits = score()
        nll = F.cross_entropy(logits, target).item()
        result["schemes"][name] = {
            "perplexity_change_pct": 100 * (math.exp(nll - base_nll) - 1),
            "top1_agreement": (logits.argmax(-1) == base.argmax(-1)).float().mean().item(),
            "mean_kl": F.kl_div(F.log_softmax(logits, -1), ref_logp, log_target=True,
                                reduction="batchmean").item()}
    emit_json(result, args.json)


if __name__ == "__main__":
    main()
