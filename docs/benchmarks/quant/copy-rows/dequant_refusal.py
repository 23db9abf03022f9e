"""The int4 x int8 library's dequantising op: a range refusal (TORCH_CHECK thrown out of the
op) alone, then after a valid call into a strided view, each in a process of its own (a
segfault there on the H100 host's CPU, torch 2.11, inside pytest).
    python docs/benchmarks/quant/copy-rows/dequant_refusal.py MODE
MODE: refuse | view-then-refuse | whole (no refusal) | mm-parts (the matmul op's refusal
without numbers in its message) | mm-width (with numbers) | dequant-shape (the dequantising
op's refusal of a scale_min, no numbers)."""
import sys
import tempfile

import torch

from backend.layers import cpu_w4a8

directory = tempfile.mkdtemp()
cpu_w4a8.build(directory)
cpu_w4a8.load(directory)
gen = torch.Generator().manual_seed(0)
codes = torch.randint(0, 16, (96, 64), generator=gen, dtype=torch.uint8)
scale, lo = torch.rand(96, 2, generator=gen) + 0.1, torch.randn(96, 2, generator=gen)
tiles, scale_min = cpu_w4a8.pack(codes, scale, lo, 32)
out = torch.full((64, 96), 7.0, dtype=torch.bfloat16)
mode = sys.argv[1]
calls = {"mm-parts": lambda: torch.ops.firsttoken.int4_w4a8_mm(torch.zeros(1, 64), tiles,
                                                                   scale_min, 3),
         "mm-width": lambda: torch.ops.firsttoken.int4_w4a8_mm(torch.zeros(1, 96), tiles,
                                                                   scale_min, 2),
         "dequant-shape": lambda: torch.ops.firsttoken.int4_w4a8_dequant_t(
             tiles, scale_min.float(), 0, 2, out[:, :32])}
if mode in calls:
    try:
        calls[mode]()
    except RuntimeError as e:
        print("raised:", str(e).splitlines()[0], flush=True)
    sys.exit(0)
if mode in ("view-then-refuse", "whole"):
    torch.ops.firsttoken.int4_w4a8_dequant_t(tiles, scale_min, 2, 4, out[:, 32:64])
    print("view call done", flush=True)
if mode == "whole":
    print("dense_t", cpu_w4a8.dense_t(tiles, scale_min, torch.bfloat16).shape, flush=True)
    sys.exit(0)
try:
    torch.ops.firsttoken.int4_w4a8_dequant_t(tiles, scale_min, 5, 7, out[:, :32])
except RuntimeError as e:
    print("raised:", str(e).splitlines()[0], flush=True)
