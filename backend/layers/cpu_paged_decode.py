"""Decode attention on the CPU that reads the paged KV cache in place (``csrc/
paged_decode_cpu.cpp``), for bf16 / float32 caches and int8 caches in the torch path's
layout (a scale per token, K/V and head) on CPUs with AVX-512F or AVX2.

The torch path (``attention.Attention._decode``) gathers each decode row's whole context
from the cache into a dense copy (``index_select``) and hands it to SDPA: on a 2-core VM,
SmolLM2 at a 256-token context, ~100 µs a layer, a quarter of a batch-1 step. The kernel
reads each position's K and V through the block table where they lie (int8 codes widened in
registers, their scales applied to the score and to the softmax weight), in fp32 with one
softmax per span of positions (split over the threads, merged per sequence), and writes the
rows' output in the model dtype. For an int8 cache the same library also quantises and
stores each step's K and V in one pass (the bits of ``kv_cache.quantise``), where torch took
a stack, six elementwise ops and two copies a layer.

A step calls it once per layer (``PagedDecode.step`` -> ``Step``): the step's block tables,
context lengths and slots are checked once and kept in a C struct, and each layer's call
stores the step's K and V (copied, or quantised for an int8 cache) and attends its decode
rows. Through torch (two ``index_copy_`` and their views for the store, the tables sliced
and checked again for the kernel) the same work took about 1 ms more of a SmolLM2 batch-1
step on a 2-core AVX2 VM (4.51 against 3.50 ms of attention at a 550-token context).

It is C++ with AVX-512 (or, in a second build, AVX2) intrinsics behind plain C functions, compiled with the system's C++
compiler (a few seconds; no torch headers) into a shared library named for its source,
flags and CPU, and called through ``ctypes``: built once per machine beside the other CPU
kernels (``backend.engine.aot_kernels``), loaded at start.
"""
from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Callable

import torch

from backend.layers import cpu_aot

SOURCE = Path(__file__).with_name("csrc") / "paged_decode_cpu.cpp"
# its part of ``EngineStats.attention_kernel`` where decode rows run it ("cpu_flash+...")
KERNEL_NAME = "cpu_paged_decode"
_COMMON = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
# The builds, the first whose CPU flags this machine has: 16 floats in one AVX-512 register,
# or in two AVX2 ones
ISAS = (("avx512f", ("avx512f",), ("-mavx512f",)),
        ("avx2", ("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")))
HEAD_DIMS = (16, 32, 64, 128, 256)
MAX_GROUP = 8  # query heads per KV head
DTYPES = {torch.bfloat16: 1, torch.float32: 0}  # q and the output: the model dtype
CACHE_KINDS = {torch.float32: 0, torch.bfloat16: 1, torch.int8: 2}  # the cache's storage
# Positions per span at the least: shorter spans cost more in their merge than they save
MIN_SPAN = 64


def flags() -> tuple[str, ...]:
    """The compiler flags of this CPU's build of the source (``ISAS``)."""
    return cpu_aot.isa_flags(ISAS, _COMMON)


def why_not_here() -> str | None:
    """Why this machine cannot build the kernel, or None."""
    return cpu_aot.why_not_buildable(
        ISAS, SOURCE, "the CPU has neither AVX-512F nor AVX2 with FMA and F16C (the torch "
        "path serves decode attention)")


def library_name() -> str:
    """The file name: a digest of the source and flags, and the CPU (``cpu_aot.cpu_tag``)."""
    return cpu_aot.library_name("paged-decode", SOURCE, flags())


def build(directory: Path) -> float:
    """Compiles the library into ``directory`` (a no-op when another process built it
    meanwhile); the seconds spent. Raises where it cannot (see ``why_not_here``)."""
    return cpu_aot.build_library(Path(directory) / library_name(), SOURCE, list(flags()),
                                 why_not_here())


class _StepArgs(ctypes.Structure):
    """``FtStep`` of the source: one step's attention over every layer's cache."""
    _fields_ = [("bf16", ctypes.c_int), ("cache_kind", ctypes.c_int),
                ("cache", ctypes.c_void_p), ("scales", ctypes.c_void_p),
                ("num_slots", ctypes.c_int64), ("slots", ctypes.c_void_p), ("T", ctypes.c_int),
                ("tables", ctypes.c_void_p), ("W", ctypes.c_int), ("lens", ctypes.c_void_p),
                ("D", ctypes.c_int), ("H", ctypes.c_int), ("kvh", ctypes.c_int),
                ("hd", ctypes.c_int), ("bs", ctypes.c_int), ("scale", ctypes.c_float),
                ("min_span", ctypes.c_int), ("threads", ctypes.c_int)]


class Step:
    """One step's attention, every layer through one C call: ``step(layer, q, k, v, out)``
    stores the layer's K and V [T, kvh, hd] at the step's slots and writes its decode rows'
    attention (q [D, H, hd] -> out [D, H, hd], contiguous) where the step has decode rows.
    q, k and v may be row-strided views (of a fused q|k|v output); heads contiguous."""

    def __init__(self, fn: Callable[..., int], args: _StepArgs,
                 keep: tuple[torch.Tensor, ...], dtype: torch.dtype) -> None:
        self._fn, self._args, self._keep, self.dtype = fn, args, keep, dtype
        self._addr = ctypes.addressof(args)
        self.num_decode = args.D
        self._rows = (args.hd, 1)  # a head's strides: heads contiguous within a row
        self._kv = (args.T, args.kvh, args.hd)
        self._q_row = (args.H, args.hd)
        self._out = (args.D, args.H, args.hd)

    def __call__(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 out: torch.Tensor | None) -> None:
        # (checks in few attribute reads: this runs once a layer of every step)
        rows = self._rows
        if k.stride() != v.stride() or k.stride()[1:] != rows:
            k, v = k.contiguous(), v.contiguous()
        d = self.num_decode
        if d and q.stride()[1:] != rows:
            q = q.contiguous()
        if not (q.dtype == k.dtype == v.dtype == self.dtype and k.shape == v.shape == self._kv
                and (not d or (q.shape[0] >= d and q.shape[1:] == self._q_row
                               and out.shape == self._out and out.dtype == self.dtype
                               and out.is_contiguous()))):
            raise ValueError("paged decode step: q [D, H, hd], k and v [T, kvh, hd] and out "
                             "[D, H, hd] in the model dtype")
        rc = self._fn(self._addr, layer, q.data_ptr(), q.stride(0), k.data_ptr(),
                      v.data_ptr(), k.stride(0), out.data_ptr() if d else None)
        if rc:
            raise ValueError(f"paged decode step: layer {layer} refused ({rc})")


class PagedDecode:
    """The loaded library: ``kernel(q, cache, tables, lens, block_size, scale)``."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        lib = ctypes.CDLL(str(self.path))
        fn = lib.ft_paged_decode
        p, i = ctypes.c_void_p, ctypes.c_int
        fn.argtypes = [i, i, p, p, p, ctypes.c_int64, p, p, i, p, i, i, i, i, i,
                       ctypes.c_float, i, i]
        fn.restype = i
        self._fn = fn
        self._step_check = lib.ft_step_check
        self._step_check.argtypes = [p]
        self._step_check.restype = i
        layer = lib.ft_step_layer
        layer.argtypes = [p, i, p, ctypes.c_int64, p, p, ctypes.c_int64, p]
        layer.restype = i
        self._step_layer = layer

    @staticmethod
    def serves(dtype: torch.dtype, storage: torch.dtype, num_heads: int, num_kv_heads: int,
               head_dim: int) -> bool:
        """Whether it runs q in ``dtype`` over a cache stored as ``storage`` (the model
        dtype, or int8 codes)."""
        return (dtype in DTYPES and storage in (dtype, torch.int8) and head_dim in HEAD_DIMS
                and num_heads % num_kv_heads == 0 and num_heads // num_kv_heads <= MAX_GROUP)

    def __call__(self, q: torch.Tensor, cache: torch.Tensor, tables: torch.Tensor,
                 lens: torch.Tensor, block_size: int, scale: float,
                 scales: torch.Tensor | None = None) -> torch.Tensor:
        """q [D, H, hd]; cache: one layer's [slots, 2, kvh, hd] (contiguous, q's dtype, or
        int8 with ``scales`` [slots, 2, kvh] float32); tables [D, W] int32 block ids; lens
        [D] int32 context lengths, this step's token included -> [D, H, hd] in q's dtype."""
        q = q.contiguous()
        tables, lens = tables.contiguous(), lens.contiguous()
        int8 = cache.dtype == torch.int8
        if not (cache.is_contiguous() and cache.dtype in (q.dtype, torch.int8)
                and tables.dtype == lens.dtype == torch.int32):
            raise ValueError("paged decode: a contiguous cache in q's dtype or int8, and int32 "
                             "tables")
        if int8 != (scales is not None) or (int8 and not (
                scales.dtype == torch.float32 and scales.is_contiguous()
                and scales.shape == cache.shape[:-1])):
            raise ValueError("paged decode: an int8 cache takes its float32 scales [slots, 2, "
                             "kvh], and only it")
        D, H, hd = q.shape
        out = torch.empty_like(q)
        rc = self._fn(DTYPES[q.dtype], CACHE_KINDS[cache.dtype], q.data_ptr(), out.data_ptr(),
                      cache.data_ptr(), cache.shape[0],
                      None if scales is None else scales.data_ptr(),
                      tables.data_ptr(), tables.shape[1], lens.data_ptr(), D, H,
                      cache.shape[-2], hd, block_size, scale, MIN_SPAN,
                      torch.get_num_threads())
        _refuse(rc, "paged decode: a context length < 1 or past its block table, or a block "
                "outside the cache", H, hd, cache.shape[-2])
        return out

    def step(self, data: torch.Tensor, scales: torch.Tensor | None, block_size: int,
             slots: torch.Tensor, tables: torch.Tensor, lens: torch.Tensor, num_decode: int,
             num_heads: int, scale: float, dtype: torch.dtype) -> Step:
        """One step over every layer of a cache (``KVCache.data`` [layers, num_slots, 2,
        kvh, hd] in ``dtype`` or int8 with ``scales`` [layers, num_slots, 2, kvh], the torch
        path's layout): the step's tokens go to ``slots`` [T] long; its first
        ``num_decode`` rows of ``tables`` [S, W] int32 / ``lens`` [S] int32 are decodes.
        Checked here once: raises ValueError for a slot, context or block outside the
        cache, or what the build does not serve."""
        _, num_slots, _, kvh, hd = data.shape
        slots = slots.contiguous()
        d = num_decode
        tables, lens = tables[:d].contiguous(), lens[:d].contiguous()
        int8 = data.dtype == torch.int8
        if not (data.is_contiguous() and data.dtype in (dtype, torch.int8) and dtype in DTYPES
                and slots.dtype == torch.int64 and tables.dtype == lens.dtype == torch.int32
                and int8 == (scales is not None)
                and (not int8 or (scales.dtype == torch.float32 and scales.is_contiguous()
                                  and scales.shape == data.shape[:-1]))):
            raise ValueError("paged decode step: a contiguous cache in the model dtype (or "
                             "int8 with its float32 scales), int64 slots and int32 tables")
        args = _StepArgs(DTYPES[dtype], CACHE_KINDS[data.dtype], data.data_ptr(),
                         None if scales is None else scales.data_ptr(), num_slots,
                         slots.data_ptr(), slots.shape[0], tables.data_ptr(), tables.shape[1],
                         lens.data_ptr(), d, num_heads, kvh, hd, block_size, scale, MIN_SPAN,
                         torch.get_num_threads())
        rc = self._step_check(ctypes.addressof(args))
        _refuse(rc, "paged decode step: a slot, a context length or a block outside the "
                "cache", num_heads, hd, kvh)
        return Step(self._step_layer, args, (data, scales, slots, tables, lens), dtype)


def _refuse(rc: int, outside: str, heads: int, head_dim: int, kv_heads: int) -> None:
    """The library's return code as a ValueError: -2 ``outside`` (nothing read or written
    there), any other nonzero a shape the build does not serve."""
    if rc == -2:
        raise ValueError(outside)
    if rc:
        raise ValueError(f"paged decode does not serve {heads} heads of {head_dim} over "
                         f"{kv_heads} KV heads")


def load(directory: Path) -> PagedDecode | None:
    """The library built for this source and machine in ``directory``, or None."""
    path = Path(directory) / library_name()
    return PagedDecode(path) if path.is_file() else None
