"""int8 weights (one scale per output row) times float32 rows on CPUs without AVX-512
(``csrc/int8_rows_cpu.cpp``): the int8 LM head's calls there, of any row count.

Without AVX-512 torch's int8 kernel (``_weight_int8pack_mm``) runs unvectorised: SmolLM2's
49,152 x 576 head took 20.7 ms at one row on a 2-core AVX2 VM, so ``--lm-head-dtype auto``
put a GGUF's Q8_0 head in fp16 through fbgemm there (2.5 ms cold, twice the int8 bytes).
This kernel reads the int8 codes in place, widens them in registers and sums in float32
(torch's arithmetic, another order of additions): 2.09 against fbgemm fp16's 2.87 ms at one
row on that VM, ahead up to 16 rows and level at 64 (docs/BENCHMARKS.md). It serves every row
count, so the head keeps no dense copy beside it.

C with AVX2 intrinsics behind a plain C function, compiled with the system's C++ compiler
(about a second), called through ``ctypes``: built once per machine beside the other CPU
kernels (``backend.engine.aot_kernels``).
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from backend.layers import cpu_aot

SOURCE = Path(__file__).with_name("csrc") / "int8_rows_cpu.cpp"
KERNEL_NAME = "cpu-int8-rows"  # ``EngineStats.lm_head_kernel`` where the head runs it
_COMMON = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
ISAS = (("avx2", ("avx2", "fma", "f16c"), ("-mavx2", "-mfma", "-mf16c")),)


def flags() -> tuple[str, ...]:
    return cpu_aot.isa_flags(ISAS, _COMMON)


def why_not_here() -> str | None:
    """Why this machine cannot build the kernel, or None."""
    return cpu_aot.why_not_buildable(ISAS, SOURCE, "the CPU lacks AVX2, FMA and F16C")


def library_name() -> str:
    return cpu_aot.library_name("int8-rows", SOURCE, flags())


def build(directory: Path) -> float:
    """Compiles the library into ``directory`` (a no-op when another process built it
    meanwhile); the seconds spent. Raises where it cannot (``why_not_here``)."""
    return cpu_aot.build_library(Path(directory) / library_name(), SOURCE, list(flags()),
                                 why_not_here())


class Int8Rows:
    """The loaded library: ``kernel(x, q, scale)`` for x [M, K] float32, q [N, K] int8,
    scale [N] float32 -> [M, N] float32 (the caller checks ``accepts``)."""

    name = KERNEL_NAME
    max_rows: int | None = None  # every row count

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        fn = ctypes.CDLL(str(self.path)).ft_int8_rows
        p, i64 = ctypes.c_void_p, ctypes.c_int64
        fn.argtypes = [p, i64, i64, p, p, i64, p, ctypes.c_int]
        fn.restype = ctypes.c_int
        self._fn = fn

    @staticmethod
    def serves(q: torch.Tensor, scale: torch.Tensor) -> bool:
        """Whether the kernel takes these weights: int8 [N, K] with K a multiple of 8 and
        float32 scales, on the CPU."""
        return (q.device.type == "cpu" and q.dtype == torch.int8 and q.dim() == 2
                and q.shape[1] % 8 == 0 and scale.dtype == torch.float32)

    def accepts(self, x: torch.Tensor) -> bool:
        return (x.dtype == torch.float32 and x.dim() == 2 and x.shape[0] > 0
                and not torch.compiler.is_compiling())

    def __call__(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        x, q, scale = x.contiguous(), q.contiguous(), scale.contiguous()
        (M, K), N = x.shape, q.shape[0]
        if q.shape[1] != K:
            raise ValueError(f"int8 rows: x's width {K} against the codes' {q.shape[1]}")
        out = torch.empty(M, N, dtype=torch.float32)
        rc = self._fn(x.data_ptr(), M, K, q.data_ptr(), scale.data_ptr(), N, out.data_ptr(),
                      torch.get_num_threads())
        if rc:
            raise ValueError(f"int8 rows does not serve [{M}, {K}] x [{N}, {K}]")
        return out


def load(directory: Path) -> Int8Rows | None:
    """The library built for this source and machine in ``directory``, or None."""
    path = Path(directory) / library_name()
    return Int8Rows(path) if path.is_file() else None
