"""int4 weight codes times int8 activations on the CPU (``csrc/int4_w4a8_cpu.cpp``): the op
``torch.ops.firsttoken.int4_w4a8_mm`` for matmuls of a few rows, on CPUs with AVX-512 VNNI
or AVX2 (a build of the source for each, ``ISAS``).

torch's int4 kernel (``_weight_int4pack_mm_for_cpu``) widens each code to float and does a
float FMA per weight; with more than one row its cost grows with the rows. This op
quantises the rows to int8 per block of 32 inputs (a scale and the block's exact sum, as
llama.cpp does for its Q4 dot products) and multiplies them with the codes by integer dot
products, 128 codes per 64-byte load and two instructions. On a 2-core EPYC VM, SmolLM2's
120 matmuls of a step: 1 row 3.48 against 3.84 ms, 8 rows 6.48 against 11.09 (docs/
BENCHMARKS.md). The price is the activations' rounding to 8 bits (stated there).

It is a torch custom op in C++ (torch headers, ~30 s to compile), so the compiled layer
pieces (``backend.engine.aot_layers``) call it inside their packages as eager code does:
built once per machine with the other CPU kernels (``backend.engine.aot_kernels``), loaded
with ``torch.ops.load_library`` before any package that calls it.

Where a layer runs the op, its tiles are the layer's only codes (torch's packing is dropped):
``dense_t`` / ``dense_matmul`` dequantise them for the dense copies and many-row calls, and
``unpack`` gives them back to a layer that returns to torch's kernel.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

from backend.layers import cpu_aot, cpu_dequant

SOURCE = Path(__file__).with_name("csrc") / "int4_w4a8_cpu.cpp"
_COMMON = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
# The builds, the first whose CPU flags this machine has: (name, /proc/cpuinfo flags,
# compiler flags). AVX-512 VNNI's dot products take 4 bytes a lane in one instruction; AVX2
# makes the same sums in two (vpmaddubsw, vpmaddwd), 8 lanes a vector.
ISAS = (("avx512-vnni", ("avx512f", "avx512bw", "avx512vl", "avx512_vnni"),
         ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni")),
        ("avx2", ("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")))
BLOCK = 32  # inputs per activation scale; the weights' groups must be whole blocks
TILE = 16   # output rows per tile
KERNEL_NAME = "cpu-int4-w4a8"
# --cpu-int4-activations -> int8 parts per block: int8 = x rounded to 8 bits of its block's
# largest value; int8x2 = the remainder rounded again (x = d q + d2 q2, ~15 bits), twice the
# dot products for nearly the model dtype's figures (docs/BENCHMARKS.md)
PARTS = {"int8": 1, "int8x2": 2}

_loaded: Path | None = None
_op = None  # the registered op's overload, once loaded
_dequant_op = None  # the library's dequantising op (``_tiles_t``), once loaded


def flags() -> tuple[str, ...]:
    """The compiler flags of this CPU's build of the source (``ISAS``)."""
    return cpu_aot.isa_flags(ISAS, _COMMON)


def why_not_here() -> str | None:
    """Why this machine cannot build the op, or None."""
    needs = " or ".join(", ".join(need) for _, need, _ in ISAS)
    return cpu_aot.why_not_buildable(ISAS, SOURCE,
                                     f"the CPU lacks {needs} (torch's int4 kernel serves)")


def serves(out_features: int, in_features: int, group_size: int) -> bool:
    """Whether a layer of these shapes and int4 groups can be packed for the op."""
    return (out_features % TILE == 0 and in_features % BLOCK == 0
            and group_size % BLOCK == 0 and in_features % group_size == 0)


def _compile_args() -> list[str]:
    from torch.utils import cpp_extension
    lib = Path(torch.__file__).parent / "lib"
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    return [*flags(), f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
            *(f"-I{p}" for p in cpp_extension.include_paths()),
            f"-I{Path(sys.base_prefix) / 'include'}",
            f"-L{lib}", "-lc10", "-ltorch_cpu", f"-Wl,-rpath,{lib}"]


def library_name() -> str:
    """A digest of the source, the flags and the torch build (its headers and ABI), and the
    CPU (``cpu_aot.cpu_tag``)."""
    return cpu_aot.library_name("int4-w4a8", SOURCE, flags(),
                                f"{torch.__version__} {torch._C._GLIBCXX_USE_CXX11_ABI}")


def build(directory: Path) -> float:
    """Compiles the op's library into ``directory`` (a no-op when another process built it
    meanwhile); the seconds spent. Raises where it cannot (see ``why_not_here``)."""
    return cpu_aot.build_library(Path(directory) / library_name(), SOURCE, _compile_args(),
                                 why_not_here())


def load(directory: Path) -> bool:
    """Registers the op from the library built in ``directory``; False when there is none.
    One library per process: a second call with the same build is a no-op."""
    global _loaded, _op, _dequant_op
    path = Path(directory) / library_name()
    if _loaded is not None:
        if _loaded.name != path.name:
            raise RuntimeError(f"the int4 x int8 op is already loaded from {_loaded}; "
                               f"{path.name} is another build of it")
        return True
    if not path.is_file():
        return False
    torch.ops.load_library(str(path))
    torch.library.register_fake("firsttoken::int4_w4a8_mm")(_fake)  # for export / AOTI
    _op = torch.ops.firsttoken.int4_w4a8_mm.default  # resolved once: ~us less a call
    _dequant_op = torch.ops.firsttoken.int4_w4a8_dequant_t.default
    _loaded = path
    return True


def _fake(x: torch.Tensor, codes: torch.Tensor, scale_min: torch.Tensor,
          parts: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], codes.shape[0] * TILE)


def loaded() -> bool:
    return _loaded is not None


def matmul(x: torch.Tensor, codes: torch.Tensor, scale_min: torch.Tensor,
           parts: int = 1) -> torch.Tensor:
    """x [M, K] (bf16 / float32 / fp16) @ W.T -> [M, N] in x's dtype (``pack``'s layout);
    x rounded to ``parts`` int8 parts per block (``PARTS``)."""
    return _op(x.contiguous(), codes, scale_min, parts)


def pack(codes: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor,
         group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W[n, k] = codes[n, k] * scale[n, k // G] + lo[n, k // G] (codes 0..15 as uint8 [N, K],
    scale / lo [N, K / G]) -> (tiles [N/16, K/8, 64] uint8, scale_min [N/16, K/32, 2, 16]
    fp16), the layout the op reads (see its source)."""
    N, K = codes.shape
    if not serves(N, K, group_size):
        raise ValueError(f"int4 x int8 packing needs N % {TILE}, K % {BLOCK} and the group "
                         f"size % {BLOCK} to be 0 (got {N} x {K}, groups of {group_size})")
    nt, kb = N // TILE, K // BLOCK
    c = codes.to(torch.uint8).view(nt, TILE, kb, 4, 2, 4)  # k = 32b + 8o + 4h + j
    byte = c[..., 0, :] | (c[..., 1, :] << 4)              # [nt, 16, kb, 4, 4]
    tiles = byte.permute(0, 2, 3, 1, 4).contiguous().view(nt, kb * 4, 64)
    per_block = group_size // BLOCK

    def blocks(v: torch.Tensor) -> torch.Tensor:  # [N, K/G] -> [nt, kb, 16]
        return (v.float().repeat_interleave(per_block, dim=1).view(nt, TILE, kb)
                .transpose(1, 2))

    scale_min = torch.stack([blocks(scale), blocks(lo)], dim=2).to(torch.float16).contiguous()
    return tiles, scale_min


def _codes_and_pairs(tiles: torch.Tensor, scale_min: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes uint8 [N, K], the (scale, lo) pair of each block of 32, float32 [N, K/32, 2])
    from ``pack``'s layout."""
    nt, k8, _ = tiles.shape
    kb = k8 // 4
    b = tiles.view(nt, kb, 4, TILE, 4)
    c = torch.stack([b & 0x0F, b >> 4], dim=3)              # [nt, kb, 4, 2, 16, 4]
    codes = c.permute(0, 4, 1, 2, 3, 5).reshape(nt * TILE, kb * BLOCK)
    return codes, scale_min.float().permute(0, 3, 1, 2).reshape(nt * TILE, kb, 2)


def unpack(tiles: torch.Tensor, scale_min: torch.Tensor, group_size: int
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``pack``'s inverse: (codes uint8 [N, K], scale [N, K / G], lo [N, K / G] float32,
    the fp16 values as stored), for a layer that goes back to torch's packing."""
    codes, sm = _codes_and_pairs(tiles, scale_min)
    step = group_size // BLOCK  # a group's blocks share its pair: take the first's
    return codes, sm[:, ::step, 0].contiguous(), sm[:, ::step, 1].contiguous()


def _dequantises(dtype: torch.dtype) -> bool:
    """Whether the library's dequantising op is loaded and writes ``dtype``."""
    return _dequant_op is not None and dtype in (torch.bfloat16, torch.float16, torch.float32)


def _tiles_t(tiles: torch.Tensor, scale_min: torch.Tensor, t0: int, t1: int,
             dtype: torch.dtype, alloc: cpu_dequant.Alloc) -> torch.Tensor:
    """W.T [K, 16 (t1 - t0)] in ``dtype`` for tiles t0..t1 in torch's int4 convention,
    W = (codes - 8) * scale + zero with zero = lo + 8 * scale: the fp16 pairs combined in
    float32, then rounded to ``dtype``. A zero at the range's middle is small where the
    weights are, so its rounding costs less than the min's would (``lo`` sits at the range's
    bottom). The one place both the per-call pass and the kept dense copy compute it: the
    same bits. Through the library's op where it is loaded (one pass over the codes, the
    layer's case: its tiles are its only codes once the op is attached), else torch ops
    (the codes made exact floats by bits, ``cpu_dequant.NIBBLE_BITS``); the two agree bit
    for bit (tests/backend/layers/test_cpu_w4a8.py)."""
    nt, kb = t1 - t0, tiles.shape[1] // 4
    n = nt * TILE
    if _dequantises(dtype):
        out = alloc("w4a8-w", (kb * BLOCK, n), dtype)
        _dequant_op(tiles, scale_min, t0, t1, out)
        return out
    int_dtype, bits, base = cpu_dequant.NIBBLE_BITS[dtype]
    src = tiles[t0:t1].view(nt, kb, 4, TILE, 4).permute(1, 2, 4, 0, 3)  # [b, o, j, t, r]
    wide = alloc("w4a8-bytes", (kb, 4, 4, nt, TILE), int_dtype)
    wide.copy_(src)
    # k = 32 b + 8 o + 4 h + j down the rows (h: low / high nibble), n = 16 t + r across
    w = alloc("w4a8-w", (kb, 4, 2, 4, n), dtype)
    w_bits = w.view(int_dtype)
    wide = wide.view(kb, 4, 4, n)
    torch.bitwise_and(wide, 15, out=w_bits[:, :, 0])
    torch.bitwise_right_shift(wide, 4, out=w_bits[:, :, 1])
    w_bits.bitwise_or_(bits)  # 2^m + q
    w.sub_(base + 8)  # q - 8, exact
    pairs = scale_min[t0:t1].permute(2, 1, 0, 3).float()  # [2, b, t, r]: scale, lo
    sz = alloc("w4a8-scale-zero", (2, kb, n), dtype)
    sz[0].view(kb, nt, TILE).copy_(pairs[0])
    sz[1].view(kb, nt, TILE).copy_(torch.addcmul(pairs[1], pairs[0], pairs.new_tensor(8.0)))
    wk = w.view(kb, BLOCK, n)
    torch.addcmul(sz[1].unsqueeze(1), wk, sz[0].unsqueeze(1), out=wk)
    return w.view(kb * BLOCK, n)


def _tile_blocks(tiles: torch.Tensor) -> list[tuple[int, int]]:
    nt, k8, _ = tiles.shape
    return [(a // TILE, b // TILE)
            for a, b in cpu_dequant.row_blocks(nt * TILE, k8 * 8, TILE)]


def dense_t(tiles: torch.Tensor, scale_min: torch.Tensor, dtype: torch.dtype
            ) -> torch.Tensor:
    """The whole W.T [K, N] in ``dtype`` from the op's layout, a layer's dense copy where
    the op's codes are its only ones: ``x @ w`` equals ``dense_matmul``."""
    nt, k8, _ = tiles.shape
    out = torch.empty(k8 * 8, nt * TILE, dtype=dtype)
    if _dequantises(dtype):
        _dequant_op(tiles, scale_min, 0, nt, out)  # the whole of it in one pass, in place
        return out
    for t0, t1 in _tile_blocks(tiles):
        out[:, t0 * TILE:t1 * TILE] = _tiles_t(tiles, scale_min, t0, t1, dtype,
                                               cpu_dequant.fresh)
    return out


def dense_matmul(x: torch.Tensor, tiles: torch.Tensor, scale_min: torch.Tensor
                 ) -> torch.Tensor:
    """x [T, K] @ W.T -> [T, N] through W dequantised from the op's layout a block of rows
    at a time: many-row calls of a layer with no torch packing and no dense copy."""
    def block(n0: int, n1: int) -> torch.Tensor:
        return x @ _tiles_t(tiles, scale_min, n0 // TILE, n1 // TILE, x.dtype,
                            cpu_dequant.scratch)

    return cpu_dequant.blockwise(x, tiles.shape[0] * TILE,
                                 [(t0 * TILE, t1 * TILE) for t0, t1 in _tile_blocks(tiles)],
                                 block)


def dequantize(tiles: torch.Tensor, scale_min: torch.Tensor) -> torch.Tensor:
    """``pack``'s inverse, in float32 [N, K] (the fp16 scales as stored): the tests' and the
    quality tools' reference."""
    codes, sm = _codes_and_pairs(tiles, scale_min)
    c = codes.float()
    scale = sm[..., 0].repeat_interleave(BLOCK, dim=1)
    lo = sm[..., 1].repeat_interleave(BLOCK, dim=1)
    return c * scale + lo
