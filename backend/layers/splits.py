"""Partial sums of matmuls split along K (CUDA, Triton), shared by ``skinny_gemm`` and
``quant_kernels``: a kernel whose output tiles are too few to occupy every multiprocessor
runs ``split`` programs per tile, each over a range of K, into fp32 partials [split, M, N].
Two ways to add them up:

  * ``finish_splits``: one more small kernel (the GEMMs: a tile is [rows, 64..256]).
  * ``add_splits``, inside the kernel: the last program of each tile to finish adds up its
    tile (the one-token GEMVs, whose tiles are a few dozen values): no extra launch. On an
    H200 (Llama-2-7B, engine step) it took int4's batch-1 step from 2.49 to 2.43 ms; on the
    GEMMs of 16-64 rows it made the step 0.7-3.6 % slower, because that one program's
    serial sum of [split, 64, 64] lengthens the kernel's tail.

The partials buffer comes from the caching allocator per call (the CUDA graphs' pool when
captured); the arrival counters are one zeroed buffer per device and stream (``counters``).
"""
from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

from backend.layers import pdl
from backend.layers.launch import fast

if triton is not None:
    from backend.layers.pdl import release as pdl_release
    from backend.layers.pdl import wait as pdl_wait

COUNTERS = 1 << 16  # tiles a kernel using ``add_splits`` may have (one counter each)

if triton is not None:
    @triton.jit
    def gather_splits(part_ptr, cnt_ptr, acc, offs, mask, numel, pid_k, n_split, tile):
        """A K-split program's fp32 sums ``acc`` (at ``offs`` of a [numel] output) into the
        partials [n_split, numel]: (whether this program is the tile's last to arrive, and
        then the partials added up in split order, so the sum does not depend on which is
        last; else zeros). The last leaves the tile's counter at 0 for the next launch. The
        next kernel on the stream starts only after this grid has finished (stream order,
        and ``pdl.wait``), so kernels can share the counters."""
        tl.store(part_ptr + pid_k * numel + offs, acc, mask=mask)
        tl.debug_barrier()  # every thread's partial is stored before the release below
        arrived = tl.atomic_add(cnt_ptr + tile, 1, sem="acq_rel", scope="gpu")
        last = arrived == n_split - 1
        total = tl.zeros_like(acc)
        if last:
            for k in range(0, n_split):
                # .cg: from L2; this multiprocessor's L1 may hold an earlier launch's lines
                total += tl.load(part_ptr + k * numel + offs, mask=mask, other=0.0,
                                 cache_modifier=".cg")
            tl.store(cnt_ptr + tile, 0)
        return last, total

    @triton.jit
    def add_splits(y_ptr, part_ptr, cnt_ptr, acc, offs, mask, numel, pid_k, n_split, tile):
        """``gather_splits``, then the tile's last program writes y in its dtype."""
        last, total = gather_splits(part_ptr, cnt_ptr, acc, offs, mask, numel, pid_k, n_split,
                                    tile)
        if last:
            tl.store(y_ptr + offs, total.to(y_ptr.dtype.element_ty), mask=mask)

    @fast
    @triton.jit
    def _sum_splits(p_ptr, y_ptr, MN, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr,
                    PDL: tl.constexpr):
        # y = sum over the SPLIT_K fp32 partials [SPLIT_K, MN], cast to y's dtype.
        pdl_wait(PDL)
        pdl_release(PDL)
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = offs < MN
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(p_ptr + s * MN + offs, mask=m, other=0.0)
        tl.store(y_ptr + offs, acc.to(y_ptr.dtype.element_ty), mask=m)


def split_out(x: torch.Tensor, M: int, N: int, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(y [M, N] in x's dtype, the buffer a kernel split ``split`` ways along K writes: y
    itself, or fp32 partials [split, M, N]) for ``finish_splits``."""
    y = torch.empty(M, N, device=x.device, dtype=x.dtype)
    if split == 1:
        return y, y
    return y, torch.empty(split, M, N, device=x.device, dtype=torch.float32)


def finish_splits(y: torch.Tensor, out: torch.Tensor, split: int) -> torch.Tensor:
    """y = the sum of the partials ``out`` (nothing to do when the kernel did not split)."""
    if split > 1:
        MN = y.numel()
        _sum_splits[(triton.cdiv(MN, 1024),)](out, y, MN, SPLIT_K=split, BLOCK=1024,
                                              **pdl.launch(y.device))
    return y


def added_in_kernel(x: torch.Tensor, M: int, N: int, split: int, tiles: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y [M, N] in x's dtype, fp32 partials [split, M, N], the arrival counters) for a
    kernel split ``split`` ways along K over ``tiles`` output tiles that adds its partials
    up itself (``add_splits``); unsplit, y stands in for all three."""
    if split > 1 and tiles > COUNTERS:
        raise ValueError(f"{tiles} tiles split along K: at most {COUNTERS}")
    y, part = split_out(x, M, N, split)
    return y, part, (counters(x.device) if split > 1 else y)


def counters(device: torch.device) -> torch.Tensor:
    """``add_splits``' arrival counters for the current stream of ``device``: kernels on one
    stream run one after another and may share them; two streams get two sets."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    return _counters(device, stream)


@functools.lru_cache(maxsize=None)
def _counters(device: torch.device, stream: int) -> torch.Tensor:
    """Zero between launches (the last program of each tile resets its own). Made on the
    first split call on the stream, which is never inside a graph capture (captures follow
    warm-up runs on the capturing stream)."""
    return torch.zeros(COUNTERS, dtype=torch.int32, device=device)
