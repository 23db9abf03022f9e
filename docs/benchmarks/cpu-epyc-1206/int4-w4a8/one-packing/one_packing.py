"""One packed copy of the int4 codes where the int4 x int8 op serves (SmolLM2, CPU engine).

  PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/int4-w4a8/one-packing/one_packing.py \
      rss [--keep-torch-packing] [--no-trim]  # the engine's resident memory after start,
                                               # one process a mode
  PYTHONPATH=. python .../one_packing.py many ROWS ROUNDS
      # a many-row call without a dense copy, over the 120 int4 layers: dequantised from
      # torch's packing, from the op's codes by the library's dequantising op, and from the
      # op's codes by torch ops (before that op), in rotation
  PYTHONPATH=. python .../one_packing.py copies ROUNDS
      # the dense copies dequantised whole in one pass against block by block

Prints one JSON line.
"""
import ctypes
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from common import keep_torch_packing, op_layers  # noqa: E402

from backend.engine import model_runner  # noqa: E402
from backend.layers import cpu_dequant, cpu_w4a8  # noqa: E402


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        kib = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kib / 1024


def rss(keep: bool, trim: bool) -> dict:
    if keep:
        keep_torch_packing()
    if not trim:  # the tree before: the heap's freed pages stay counted
        model_runner.return_freed_heap = lambda: False
    eng, layers = op_layers("int8x2")
    status = eng.stats().cpu_aot_kernels["int4_w4a8"]
    after_start = rss_mib()
    # what the heap still holds freed (counted in RSS until trimmed), trimmed here in any mode
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return {"mode": "torch packing kept" if keep else "released", "runner_trims": trim,
            "rss_mib_after_start": after_start, "rss_mib_trimmed": rss_mib(),
            "freed_bytes": status.get("torch_packing_freed_bytes"),
            "layers": len(layers), "torch_packed": sum(m.torch_packed for m in layers),
            "torch_threads": torch.get_num_threads()}


def many(rows: int, rounds: int) -> dict:
    keep_torch_packing()
    _, layers = op_layers("int8x2")
    gen = torch.Generator().manual_seed(0)
    xs = {m.in_features: torch.randn(rows, m.in_features, generator=gen).bfloat16()
          for m in layers}
    ways = {
        "torch packing": lambda m, x: cpu_dequant.int4_matmul(x, m.packed, m.scale_zero,
                                                              m.group_size),
        "op codes": lambda m, x: cpu_w4a8.dense_matmul(
            x, m.w4a8_codes, m.w4a8_scale_min.view(torch.float16)),
        # the op's codes dequantised by torch ops, as before the library's dequantising op
        "op codes, torch ops": lambda m, x: _torch_ops(cpu_w4a8.dense_matmul, x, m.w4a8_codes,
                                                       m.w4a8_scale_min.view(torch.float16)),
    }
    diffs, same = [], True
    for m in layers:
        x = xs[m.in_features]
        a, b, c = (f(m, x).float() for f in ways.values())
        diffs.append(((a - b).norm() / a.norm()).item())
        same = same and torch.equal(b, c)
    totals = rotated(ways, rounds, lambda f: [f(m, xs[m.in_features]) for m in layers])
    return {"rows": rows, "rounds": rounds, "layers": len(layers),
            "ms_median": {k: statistics.median(v) for k, v in totals.items()},
            "ms": totals, "op_and_torch_ops_equal": same,
            "relative_difference_median": statistics.median(diffs),
            "relative_difference_max": max(diffs), "torch_threads": torch.get_num_threads()}


def rotated(ways: dict, rounds: int, run) -> dict[str, list[float]]:
    """ms of ``run(way)`` per way over ``rounds``, the order rotated every round."""
    totals: dict[str, list[float]] = {k: [] for k in ways}
    names = list(ways)
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            t0 = time.perf_counter()
            run(ways[name])
            totals[name].append((time.perf_counter() - t0) * 1e3)
    return totals


def copies(rounds: int) -> dict:
    """The 120 layers' dense copies dequantised (bf16, before oneDNN's reorder): the whole
    copy in one pass of the library's op (``cpu_w4a8.dense_t``) against block by block into
    fresh buffers, then copied into place (its first form), alternating."""
    _, layers = op_layers("int8x2")

    def by_blocks(tiles, sm, dtype):
        nt, k8, _ = tiles.shape
        out = torch.empty(k8 * 8, nt * cpu_w4a8.TILE, dtype=dtype)
        for t0, t1 in cpu_w4a8._tile_blocks(tiles):
            out[:, t0 * cpu_w4a8.TILE:t1 * cpu_w4a8.TILE] = cpu_w4a8._tiles_t(
                tiles, sm, t0, t1, dtype, cpu_dequant.fresh)
        return out

    ways = {"whole, in place": cpu_w4a8.dense_t, "by blocks": by_blocks}
    same = all(torch.equal(*(f(m.w4a8_codes, m._w4a8_scale_min(), torch.bfloat16)
                             for f in ways.values())) for m in layers)
    totals = rotated(ways, rounds, lambda f: [
        f(m.w4a8_codes, m._w4a8_scale_min(), torch.bfloat16) for m in layers])
    return {"mode": "copies", "rounds": rounds, "layers": len(layers), "equal": same,
            "ms_median": {k: statistics.median(v) for k, v in totals.items()}, "ms": totals,
            "torch_threads": torch.get_num_threads()}


def _torch_ops(fn, *args):
    op, cpu_w4a8._dequant_op = cpu_w4a8._dequant_op, None
    try:
        return fn(*args)
    finally:
        cpu_w4a8._dequant_op = op


if __name__ == "__main__":
    with torch.inference_mode():
        if sys.argv[1] == "rss":
            out = rss("--keep-torch-packing" in sys.argv, "--no-trim" not in sys.argv)
        elif sys.argv[1] == "copies":
            out = copies(int(sys.argv[2]))
        else:
            out = many(int(sys.argv[2]), int(sys.argv[3]))
    print(json.dumps(out))
