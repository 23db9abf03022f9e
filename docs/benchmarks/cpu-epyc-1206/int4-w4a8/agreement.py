"""How far apart the CPU's int4 paths are, on SmolLM2's 120 block matmuls (the file's Q4_1
codes): torch's int4 kernel ("model"), the int4 x int8 op with two parts ("int8x2") and the
kept bf16 dense copies that steps of many rows take ("copy"), on the same bf16 rows. Per
pair: the median relative difference of the layers' outputs and how many layers agree bit
for bit; and whether a row's copy output depends on how many rows share the call (1, 7, 8,
9 against 16). A request's greedy tokens can flip at a near-tie wherever its rows move from
one path to another between two runs.

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int4-w4a8/agreement.py > OUT.json

Since the layers drop torch's packing once the op is attached (their copies rebuilt from the
op's codes), torch's kernel runs on a packing rebuilt from the op's codes and fp16 pairs, as
``detach_w4a8`` would (``agreement.json`` is from the tree before, with the file's packing).
"""
import json
import statistics

import torch
from common import op_layers

from backend.layers import cpu_w4a8


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def torch_packing(m) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed, scale_zero) for torch's int4 kernel, from the layer's own packing where it
    kept one, else from the op's codes."""
    if m.torch_packed:
        return m.packed, m.scale_zero
    codes, scale, lo = cpu_w4a8.unpack(m.w4a8_codes, m.w4a8_scale_min.view(torch.float16),
                                       m.group_size)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.to(torch.int32), 1)
    scale_zero = torch.stack([scale, lo + 8 * scale], dim=-1).transpose(0, 1).contiguous()
    return packed, scale_zero.to(m.dtype)


def main() -> None:
    eng, layers = op_layers("int8x2", copies=True)
    gen = torch.Generator().manual_seed(0)
    diffs = {k: [] for k in ("model_vs_copy", "int8x2_vs_copy", "int8x2_vs_model",
                             "model_vs_float", "int8x2_vs_float", "copy_vs_float")}
    same = {k: 0 for k in diffs if not k.endswith("float")}
    copy_rows_same = {m: 0 for m in (1, 7, 8, 9)}
    op_rows_same = {m: 0 for m in (1, 7, 8, 9)}
    with torch.inference_mode():
        for m in layers:
            x = torch.randn(16, m.in_features, generator=gen).to(torch.bfloat16)
            ref = x.double() @ m.dequantized().double().t()
            packed, scale_zero = torch_packing(m)
            out = {"copy": m.copy_matmul(x),
                   "model": torch._weight_int4pack_mm_for_cpu(x, packed, m.group_size,
                                                              scale_zero),
                   "int8x2": cpu_w4a8.matmul(x, m.w4a8_codes,
                                             m.w4a8_scale_min.view(torch.float16), 2)}
            for a, b in (("model", "copy"), ("int8x2", "copy"), ("int8x2", "model")):
                diffs[f"{a}_vs_{b}"].append(rel(out[a], out[b]))
                same[f"{a}_vs_{b}"] += torch.equal(out[a], out[b])
            for a in ("model", "int8x2", "copy"):
                diffs[f"{a}_vs_float"].append(rel(out[a], ref))
            for rows in copy_rows_same:
                copy_rows_same[rows] += torch.equal(m.copy_matmul(x[:rows]), out["copy"][:rows])
                op_rows_same[rows] += torch.equal(
                    cpu_w4a8.matmul(x[:rows], m.w4a8_codes,
                                    m.w4a8_scale_min.view(torch.float16), 2),
                    out["int8x2"][:rows])
    print(json.dumps({
        "layers": len(layers), "rows": 16,
        "median_rel_diff": {k: statistics.median(v) for k, v in diffs.items()},
        "max_rel_diff": {k: max(v) for k, v in diffs.items()},
        "layers_bit_equal": same,
        "copy_rows_bit_equal_to_16_row_call": copy_rows_same,
        "int8x2_rows_bit_equal_to_16_row_call": op_rows_same,
        "copy_kernel": layers[0].prefill_kernel(),
        "torch_packing_kept": sum(m.torch_packed for m in layers)}, indent=1))


if __name__ == "__main__":
    main()
