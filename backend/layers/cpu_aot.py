"""CPU kernels compiled ahead of time (torch.export + AOTInductor into a ``.pt2`` package):
the one-row int8 weight-only GEMV of a large layer (the LM head at batch 1).

torch's ``_weight_int8pack_mm`` runs a wide int8 layer's single row compute-bound (SmolLM2's
49,152 x 576 head at ~15 GMAC/s on two cores); the code inductor generates for the plain
expression in ``Int8Gemv`` (widen, multiply, sum in fp32, scale) streams the same bytes in
about two thirds of the time. Generating it needs a C++ compiler and 5-25 s, so it is done
once per machine and the package kept (~1.5 MB, weights not included: they are inputs);
loading one takes a few ms. The package is specific to its shapes and dtypes, to the torch
build and to the CPU it was compiled on, all of which its file name carries.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

# The dtypes the compiled GEMV takes x (and the scales) in: the CPU's model dtypes.
DTYPES = (torch.bfloat16, torch.float32, torch.float16)


class Int8Gemv(nn.Module):
    """x [1, K] @ (q [N, K] int8 * scale [N]).T -> [1, N] in x's dtype, summed in fp32."""

    def forward(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        y = (q.to(torch.float32) * x.to(torch.float32)).sum(-1) * scale.to(torch.float32)
        return y.to(x.dtype).unsqueeze(0)


def package_name(n: int, k: int, dtype: torch.dtype) -> str:
    """The file name of the GEMV package for [n, k] weights and x in ``dtype`` on this
    machine: the torch build, the vector ISA and a digest of the CPU's model and feature
    flags (inductor compiles with ``-march=native``: a cache shared between machines must
    not hand one CPU's code to another)."""
    isa = torch.backends.cpu.get_cpu_capability()
    version = re.sub(r"[^A-Za-z0-9.]+", "_", torch.__version__)
    return (f"int8-gemv-{n}x{k}-{str(dtype).removeprefix('torch.')}-torch{version}-"
            f"{isa.lower()}-{cpu_tag()}.pt2")


@functools.cache
def cpu_info() -> dict[str, str]:
    """The first CPU's fields in /proc/cpuinfo ("model name", "flags", ...); empty where
    there is none."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    return fields


@functools.cache
def cpu_tag() -> str:
    """8 hex digits naming this CPU: its model name and feature flags (/proc/cpuinfo),
    else what the platform module knows."""
    fields = cpu_info()
    text = "|".join((fields.get("model name", platform.processor()), fields.get("flags", ""),
                     platform.machine()))
    return hashlib.sha256(text.encode()).hexdigest()[:8]


class OneRowInt8:
    """A loaded GEMV package: ``kernel(x, q, scale)`` for x [1, K] contiguous in the dtype
    it was built for (the caller checks ``accepts``; the compiled code does not check its
    inputs' shapes or strides)."""

    name = "aot-inductor-int8-gemv"  # ``EngineStats.lm_head_kernel`` where the head runs it
    max_rows: int | None = 1

    def __init__(self, path: Path, dtype: torch.dtype) -> None:
        self.path, self.dtype = path, dtype
        self._run = load_runner(path)

    def accepts(self, x: torch.Tensor) -> bool:
        return (x.shape[0] == 1 and x.dtype == self.dtype and x.is_contiguous()
                and not torch.compiler.is_compiling())

    def __call__(self, x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self._run([x, q, scale])[0]  # [1, N]


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| / max |want| (a package's check against the path it replaces)."""
    got, want = got.float(), want.float()
    return (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)


# Loads a package in a process of its own, after the op libraries this process loaded (a
# package calls their ops): the exit status says whether it loads here
_LOAD_PROBE = ("import sys, torch\n"
               "for lib in sys.argv[2:]: torch.ops.load_library(lib)\n"
               "torch._C._aoti.AOTIModelPackageLoader(sys.argv[1], 'model', False, 1, -1)")


def check_loads_here(path: Path) -> None:
    """Raises RuntimeError unless the package at ``path`` loads in a fresh process on this
    host. Checked once per package (a ``.loads`` file beside it records the pass): on one
    host (torch 2.11, g++ 13.3) every package built there, a trivial one too, crashed the
    process in the loader's constructor (SIGSEGV), which no exception can catch."""
    mark = path.with_name(path.name + ".loads")
    if mark.is_file():
        return
    try:
        proc = subprocess.run([sys.executable, "-c", _LOAD_PROBE, str(path),
                               *sorted(torch.ops.loaded_libraries)],
                              capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{path.name}: loading it in a fresh process took over "
                           f"{exc.timeout:.0f} s") from None
    if proc.returncode < 0:
        raise RuntimeError(f"{path.name} crashes the process that loads it on this host "
                           f"(signal {-proc.returncode} in a fresh process)")
    if proc.returncode:
        tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"{path.name} does not load on this host: {tail[0][:300]}")
    try:
        mark.touch()
    except OSError:  # a read-only cache: checked again at the next start
        pass


def load_runner(path: Path) -> Callable[[list[torch.Tensor]], list[torch.Tensor]]:
    """A package's ``run``: a list of input tensors -> the list of its outputs. Raises
    RuntimeError for a package that does not load here (``check_loads_here``)."""
    check_loads_here(path)
    # The package loader itself: torch._inductor.aoti_load_package wraps the same loader
    # but importing torch._inductor adds ~1.1 s to the backend's start (2-core VM).
    loader_cls = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    if loader_cls is not None:
        return loader_cls(str(path), "model", False, 1, -1).run
    from torch._inductor import aoti_load_package
    model = aoti_load_package(str(path))
    return lambda args: model.loader.run(args)


def load(directory: Path, n: int, k: int, dtype: torch.dtype) -> OneRowInt8 | None:
    """The package for this shape and machine from ``directory``, or None when none was
    built. A package that is there but does not load raises."""
    path = Path(directory) / package_name(n, k, dtype)
    if not path.is_file():
        return None
    return OneRowInt8(path, dtype)


def compile_package(path: Path, module: nn.Module, args: tuple,
                    dynamic_shapes: dict | None = None) -> float:
    """Exports ``module`` at ``args`` (``dynamic_shapes`` as ``torch.export.export`` takes
    them) and compiles it into the package ``path`` (a no-op when another process built it
    meanwhile); the seconds spent. Raises where torch cannot compile (no C++ compiler, an
    unsupported platform, an untraceable module)."""
    def write(partial: Path) -> None:
        from torch._inductor import aoti_compile_and_package
        program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes,
                                      strict=False)
        aoti_compile_and_package(program, package_path=str(partial))

    return build_once(path, write)


def build_once(path: Path, write: Callable[[Path], None]) -> float:
    """``write(partial)`` makes the file at ``path`` (a no-op when another process built it
    meanwhile): under the directory's build lock, into a partial file of the same suffix
    (inductor wants .pt2 on the package it writes) moved into place whole, so a reader never
    sees half a file; the seconds spent."""
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with open(path.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two starts at once compile once
        if path.is_file():
            return time.perf_counter() - t0
        partial = path.with_name(f".{path.stem}.{os.getpid()}.partial{path.suffix}")
        try:
            write(partial)
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)
    return time.perf_counter() - t0


def compiler() -> str:
    """The C++ compiler our own CPU libraries are built with: $CXX, else c++."""
    return os.environ.get("CXX", "c++")


def no_compiler() -> str | None:
    """Why our C++ libraries cannot be built here (no compiler), or None."""
    if shutil.which(compiler()) is None:
        return "no C++ compiler (c++ or $CXX) to build it"
    return None


# (name, /proc/cpuinfo flags it needs, compiler flags): one build of a C++ source each
Isa = tuple[str, tuple[str, ...], tuple[str, ...]]


def first_isa(isas: tuple[Isa, ...]) -> Isa | None:
    """The first of ``isas`` whose CPU flags this machine has, or None."""
    flags = set(cpu_info().get("flags", "").split())
    return next((isa for isa in isas if flags.issuperset(isa[1])), None)


def why_not_buildable(isas: tuple[Isa, ...], source: Path, lacking: str) -> str | None:
    """Why one of our C++ libraries cannot be built here: the CPU has none of ``isas``
    (``lacking``), its ``source`` is missing, or there is no compiler; else None."""
    if first_isa(isas) is None:
        return lacking
    if not source.is_file():
        return f"its source {source.name} is not installed beside this module"
    return no_compiler()


def isa_flags(isas: tuple[Isa, ...], common: tuple[str, ...]) -> tuple[str, ...]:
    """``common`` and the compiler flags of this CPU's build (``first_isa``); the first
    build's where none fits (its ``why_not_here`` refuses to build then)."""
    return (*common, *(first_isa(isas) or isas[0])[2])


def library_name(prefix: str, source: Path, flags: tuple[str, ...], extra: str = "") -> str:
    """A library's file name: ``prefix``, a digest of its source, flags and ``extra`` (what
    else it was built against), and the CPU (``cpu_tag``)."""
    h = hashlib.sha256(source.read_bytes())
    h.update(" ".join(flags).encode())
    h.update(extra.encode())
    return f"{prefix}-{h.hexdigest()[:16]}-{cpu_tag()}.so"


def build_library(path: Path, source: Path, args: list[str], why_not: str | None) -> float:
    """Compiles ``source`` with ``args`` into the shared library ``path`` (``build_once``:
    a no-op when another process built it meanwhile); the seconds spent. Raises
    ``why_not`` (the library's reason it cannot be built here) where there is one."""
    if why_not is not None:
        raise RuntimeError(why_not)

    def write(partial: Path) -> None:
        done = subprocess.run([compiler(), str(source), "-o", str(partial), *args],
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"compiling {source.name} failed: {done.stderr[-2000:]}")

    return build_once(path, write)


def build(directory: Path, n: int, k: int, dtype: torch.dtype) -> tuple[Path, float]:
    """Compiles the GEMV package for this shape and machine into ``directory`` (a no-op when
    another process built it meanwhile); (its path, seconds spent). Raises where torch
    cannot compile (no C++ compiler, an unsupported platform)."""
    if dtype not in DTYPES:
        raise ValueError(f"no compiled int8 GEMV for x in {dtype}")
    path = Path(directory) / package_name(n, k, dtype)
    args = (torch.zeros(1, k, dtype=dtype), torch.zeros(n, k, dtype=torch.int8),
            torch.ones(n, dtype=dtype))
    return path, compile_package(path, Int8Gemv(), args)
