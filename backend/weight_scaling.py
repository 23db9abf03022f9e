"""Activation-aware scaling of the linear weights before they are quantised (the idea of AWQ,
Lin et al. 2023), folded into the weights so it costs nothing at run time.

A few input channels of each layer carry activations tens of times larger than the rest
(SmolLM2's last down projection: 100x the median). Per-row int8 (or group-wise int4) rounds
every weight of a row to the same step, so the error on those columns dominates the output
error. Multiplying column k of W by s_k before quantising and dividing the input by s_k
gives those columns finer steps; the division is folded into what produces the input:

  * q|k|v and gate|up: the RMSNorm weight in front of them (norm_w / s);
  * down: the up rows of gate|up (silu(gate) * (up / s) = (silu(gate) * up) / s), where
    per-row int8 and group-wise int4 are unchanged by a row's scale, so gate|up's own
    rounding is what it was.

The attention output projection (o) is left as it is: its input is attention's, and folding
there would reshape the V cache that int8 / fp8 KV quantisation sees; scaling it measured no
gain on SmolLM2.

Per layer, s = mean|x|^alpha over a calibration text's tokens, alpha from 0 (no scaling, so
the choice is never worse than plain rounding on the calibration rows) to 1, picked by the
squared error of x @ W_q^T against x @ W^T. The calibration pass runs the dense model once,
layer by layer, with plain causal attention (no KV cache).

    scale_and_quantize(model, fmt, tokens) -> ScalingReport
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from backend.layers.linear import DenseLinear, WeightFormat, make_linear
from backend.layers.quantize import (dequantize_fp8, dequantize_int8, quantize_fp8, quantize_int4,
                                     quantize_int8)
from backend.model import DecoderLayer, LlamaModel

# Our own mixed text (chat turns, prose, code, numbers, lists): no overlap with the
# evaluation text of backend.engine.kv_quality.
CALIBRATION_TEXT = Path(__file__).resolve().parent / "data" / "calibration.txt"
ALPHAS = tuple(i / 10 for i in range(11))
CALIBRATION_TOKENS = 512  # of the text: mean |x| settles well before (SmolLM2)
SEARCH_ROWS = 256  # of those, the tokens each candidate's error is measured on
SCALED_KINDS = ("qkv", "gate_up", "down")


@dataclass(frozen=True)
class ScalingReport:
    """What ``--weights-scaling`` did at load (``/health``)."""
    mode: str  # activation | none, as asked
    applied: bool
    calibration_tokens: int
    seconds: float
    reason: str
    alphas: dict[str, float] = dataclasses.field(default_factory=dict)  # kind -> mean alpha

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def not_applied(mode: str, reason: str) -> ScalingReport:
    return ScalingReport(mode, False, 0, 0.0, reason)


def rounding_error(fmt: WeightFormat, w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """w [N, K] float32 -> what a layer of ``fmt`` in model dtype ``dtype`` multiplies by,
    minus w. For int4 the group scales and mins are taken as float32 (the layer keeps them
    in the model dtype): the estimate leaves their rounding out."""
    if fmt.kind == "int8":
        return dequantize_int8(*quantize_int8(w, dtype)).sub_(w)
    if fmt.kind == "int4":
        return quantize_int4(w, fmt.group_size).dequantize().sub_(w)
    if fmt.kind == "fp8":
        return dequantize_fp8(*quantize_fp8(w)).sub_(w)
    raise ValueError(f"no rounding for weight format {fmt.kind!r}")


def search_scale(w: torch.Tensor, x: torch.Tensor, amean: torch.Tensor, fmt: WeightFormat,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, float]:
    """w [N, K], x [R, K] sampled inputs, amean [K] mean |input| (float32) -> (s [K],
    alpha) whose rounding moves x @ W^T the least."""
    amean = amean.clamp(min=1e-6)
    best: tuple[float, torch.Tensor, float] | None = None
    for alpha in ALPHAS:
        s = amean.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()  # centred, so neither end leaves the range
        # (x / s) @ (round(W s) - W s)^T: the output's change, [R, N]
        err = ((x / s) @ rounding_error(fmt, w * s, dtype).T).pow(2).mean().item()
        if best is None or err < best[0]:
            best = (err, s, alpha)
    return best[1], best[2]


def scale_and_quantize(model: LlamaModel, fmt: WeightFormat, tokens: list[int]
                       ) -> ScalingReport:
    """``model``: its block linears dense and loaded. Scales them as above and replaces each
    with a layer of ``fmt`` (loaded from the scaled float weights); ``model.weight_format``
    becomes ``fmt``."""
    started = time.perf_counter()
    tokens = tokens[: min(CALIBRATION_TOKENS, model.cos_table.shape[0])]
    ids = torch.tensor(tokens, device=model.embed.device)
    positions = torch.arange(len(tokens), device=ids.device)
    cos, sin = model.cos_table[positions], model.sin_table[positions]
    rows = torch.linspace(0, len(tokens) - 1, min(SEARCH_ROWS, len(tokens)),
                          device=ids.device).long()
    chosen: dict[str, list[float]] = {kind: [] for kind in SCALED_KINDS}
    with torch.inference_mode():
        x, residual = F.embedding(ids, model.embed), None
        for layer in model.layers:
            inputs, (x, residual) = run_block(layer, x, residual, cos, sin)
            scales = {}
            for kind in SCALED_KINDS:
                w = getattr(layer, kind).weight.float()
                x_in = inputs[kind]  # [T, K] in the model dtype
                amean = x_in.abs().float().mean(0)
                scales[kind], alpha = search_scale(w, x_in[rows].float(), amean, fmt,
                                                   model.dtype)
                chosen[kind].append(alpha)
            fold_and_replace(layer, scales, fmt)
    model.weight_format = fmt
    alphas = {k: round(sum(v) / len(v), 3) for k, v in chosen.items()}
    seconds = time.perf_counter() - started
    return ScalingReport("activation", True, len(tokens), round(seconds, 2),
                         f"activation: {len(tokens)} calibration tokens, "
                         f"{len(model.layers) * len(SCALED_KINDS)} layers", alphas)


def run_block(layer: DecoderLayer, x: torch.Tensor, residual: torch.Tensor | None,
              cos: torch.Tensor, sin: torch.Tensor
              ) -> tuple[dict[str, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]:
    """One block over the whole text with causal attention, dense and cache-free; returns
    the inputs (model dtype, [T, K]) its scaled linears saw, and the block's (output,
    residual)."""
    inputs: dict[str, torch.Tensor] = {}
    hooks = [getattr(layer, kind).register_forward_pre_hook(
        lambda _m, args, kind=kind: inputs.__setitem__(kind, args[0]))
        for kind in SCALED_KINDS]
    try:
        T = x.shape[0]
        q, k, v, residual = layer.pre_attention(x, residual, cos, sin)
        # [T, heads, hd] -> [heads, T, hd]; GQA: each KV head serves H / kvh query heads
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1),
                                             v.transpose(0, 1), is_causal=True,
                                             enable_gqa=True)
        out = out.transpose(0, 1).reshape(T, layer.H * layer.hd)
        return inputs, layer.post_attention(out, residual)
    finally:
        for hook in hooks:
            hook.remove()


def fold_and_replace(layer: DecoderLayer, s: dict[str, torch.Tensor],
                     fmt: WeightFormat) -> None:
    """Multiply the q|k|v, gate|up and down weights' input columns by ``s[kind]`` [K],
    divide what feeds them by the same, and rebuild the block's linears in ``fmt`` from the
    results (o from its weight as it is)."""
    qkv = layer.qkv.weight.float() * s["qkv"]
    gate_up = layer.gate_up.weight.float() * s["gate_up"]
    gate_up[layer.inter:] /= s["down"].unsqueeze(1)  # the up rows feed down's input
    down = layer.down.weight.float() * s["down"]
    layer.input_norm.copy_(layer.input_norm.float() / s["qkv"])
    layer.post_norm.copy_(layer.post_norm.float() / s["gate_up"])
    for kind, w in (("qkv", qkv), ("gate_up", gate_up), ("down", down), ("o", None)):
        old: DenseLinear = getattr(layer, kind)
        new = make_linear(fmt, old.out_features, old.in_features, old.bias is not None,
                          old.device, old.dtype)
        new.load_rows(slice(None), old.weight.float() if w is None else w)
        if old.bias is not None:
            new.bias.copy_(old.bias)
        setattr(layer, kind, new)
