"""The CPU code the engine runs compiled ahead of time (``backend.layers.cpu_aot``) in
steps of few rows: the int8 LM head's one-row GEMV and the quantised layers' work between
attention calls (``backend.engine.aot_layers``: one package for one-row steps, one for
steps of 2 up to 31 rows (int4 layers on the int4 x int8 op; 8 on torch's int4 kernel, 3 for
int8)); our C++ libraries: the int4 x int8 op (``backend.layers.cpu_w4a8``), the int8 LM
head's kernel for every row count on CPUs without AVX-512 (``backend.layers.cpu_int8_rows``)
and, in steps of any size, the decode rows' attention over a cache in the model dtype or
int8 read in place, with the int8 store (``backend.layers.cpu_paged_decode``; AVX-512F or
AVX2). Packages and libraries live in the weights cache, ``$FIRSTTOKEN_CACHE/kernels``
(default ``~/.cache/firsttoken/kernels``), one per shape and machine; ``make model`` builds
the embedded model's. At start the engine loads a package that is there
(``--cpu-aot-kernels auto``), compiles a missing one first (``build``, 10-40 s once) or
runs the eager path (``off``, and wherever no package loads);
``python -m backend.engine.build_kernels`` builds a model's packages and exits.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import torch

from backend.engine import aot_layers
from backend.layers import cpu_aot, cpu_int8_rows, cpu_paged_decode, cpu_w4a8
from backend.layers.attention import Attention, AttentionMetadata
from backend.layers.kv_cache import KVCache
from backend.layers.linear import Int4Linear, Int8Linear
from backend.model import LlamaModel
from backend.weights.paths import cache_root

log = logging.getLogger(__name__)

T = TypeVar("T")
K = TypeVar("K", cpu_aot.OneRowInt8, cpu_int8_rows.Int8Rows)
BUILD_HINT = "python -m backend.engine.build_kernels --model MODEL builds it"


@dataclass(frozen=True)
class AotKernels:
    """What became of the LM head's compiled one-row kernel (``/health``), and in
    ``layers`` / ``few_rows_layers`` of the layer pieces for one-row steps / steps of 2 to
    ``rows`` rows (``backend.engine.aot_layers``), in ``decode_attention`` of the paged
    decode kernel (``backend.layers.cpu_paged_decode``) and in ``int4_w4a8`` of the int4 x
    int8 op (``backend.layers.cpu_w4a8``), the same fields: {"status", "reason", "path",
    "build_seconds"} (and "rows": [first, last] for the second; "layers": how many run the
    op, for the last)."""

    mode: str  # --cpu-aot-kernels
    lm_head: str  # loaded, built, not built, not used, off, failed
    reason: str = ""
    path: str | None = None
    build_seconds: float | None = None
    layers: dict = field(default_factory=dict)
    few_rows_layers: dict = field(default_factory=dict)
    decode_attention: dict = field(default_factory=dict)
    int4_w4a8: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def kernels_dir() -> Path:
    return cache_root() / "kernels"


def attach(model: LlamaModel, attn: Attention, mode: str,
           int4_activations: str, int8_rows: bool = False) -> AotKernels:
    """Gives the model on the CPU its compiled one-token kernels, per ``mode``, after the
    step ops are chosen (compiled step ops get none): the int4 layers' int4 x int8 op
    where ``int4_activations`` asks for it (int8x2 / int8), first, as the layer pieces call
    it; the int8 LM head's one-row GEMV (or, with ``int8_rows``, on CPUs where torch's int8
    kernel is unvectorised, ``cpu_int8_rows`` for all its calls) and the layer pieces
    between attention calls; and ``attn`` its paged decode kernel. A package that does not
    load, or whose output differs from the eager path's on the model's own weights, is not
    used (the engine runs the eager path and says why)."""
    w4a8 = attach_int4_w4a8(model, mode, int4_activations)
    head = attach_head(model, mode, int8_rows)
    one, few = attach_layers(model, mode)
    return replace(head, layers=one, few_rows_layers=few,
                   decode_attention=attach_decode_attention(model, attn, mode),
                   int4_w4a8=w4a8)


def int4_op_ready(mode: str, activations: str) -> bool:
    """Whether int4 layers on this CPU would run their few-row calls through the int4 x int8
    op: asked for (``activations``, ``mode``), a build for this CPU, and its library in the
    kernels directory or ``mode`` build (``make model`` builds it for the embedded model).
    Checked before the weights are loaded, so ``--weights-dtype auto`` keeps a file's int4
    codes only where they will not fall to torch's int4 kernel, which without AVX-512 runs
    unvectorised."""
    return activations != "model" and _library_ready(cpu_w4a8, mode)


def int8_rows_ready(mode: str, dtype: torch.dtype) -> bool:
    """Whether an int8 LM head on this CPU would run through ``cpu_int8_rows``: float32
    activations, a build for this CPU, and its library in the kernels directory or ``mode``
    build (``make model`` builds it). Checked before the weights are loaded, so
    ``--lm-head-dtype auto`` keeps a file's Q8_0 head as int8 codes only where they will
    not fall to torch's int8 kernel, which without AVX-512 runs unvectorised."""
    return dtype == torch.float32 and _library_ready(cpu_int8_rows, mode)


def _library_ready(module: ModuleType, mode: str) -> bool:
    """Whether one of our C++ libraries (``module``) would be there at start: not ``off``, a
    build for this CPU, and the library in the kernels directory or ``mode`` build."""
    if mode == "off" or module.why_not_here() is not None:
        return False
    return mode == "build" or (kernels_dir() / module.library_name()).is_file()


def _int4_layers(model: LlamaModel) -> list[Int4Linear]:
    return [m for m in model.modules() if isinstance(m, Int4Linear)]


def attach_int4_w4a8(model: LlamaModel, mode: str, activations: str) -> dict:
    """The int4 layers' calls of few rows through the int4 x int8 op (``cpu_w4a8``): where
    ``activations`` asks for it (int8x2 / int8), the step is eager on the CPU, and the
    library loads and agrees with torch's int4 kernel on the first layer's own weights; its
    ``_status``, with the count of layers that run it."""
    layers = _int4_layers(model)
    for layer in layers:
        if layer.w4a8:
            layer.detach_w4a8()
    if not layers:
        return _status("not used", "no int4 layers")
    if activations == "model":
        return _status("off", "--cpu-int4-activations model: torch's int4 kernel")
    parts = cpu_w4a8.PARTS[activations]
    if mode == "off":
        return _status("off", "--cpu-aot-kernels off")
    if model.device.type != "cpu":
        return _status("not used", "the CPU's int4 layers only")
    if model.compiled_pieces:
        return _status("not used", "--compile: the compiled step keeps torch's int4 kernel")
    serves = [m for m in layers if m.w4a8_serves()]
    if not serves:
        return _status("not used", "no int4 layer of whole tiles (16 outputs, groups of 32 "
                       "inputs) in a layout it reads")
    ok, status = _library("the int4 x int8 op", cpu_w4a8, mode,
                          lambda directory: _checked_w4a8(directory, serves[0], parts))
    if not ok:
        return status
    for layer in serves:
        if not layer.w4a8:  # the checked one is attached already
            layer.attach_w4a8(parts)
    # Checked and attached everywhere: torch's packing of the same codes is not needed
    freed = sum(layer.release_torch_packing() for layer in serves)
    return {**status, "layers": len(serves), "activations": activations,
            "torch_packing_freed_bytes": freed}


def _checked_w4a8(directory: Path, layer: Int4Linear, parts: int) -> bool:
    """Loads the op, and checks it against torch's int4 kernel on ``layer``'s own weights,
    four random rows (the gap: the activations' 8 bits); ``layer`` stays attached if it
    agrees."""
    if not cpu_w4a8.load(directory):
        raise RuntimeError(f"no {cpu_w4a8.library_name()} in {directory}")
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, layer.in_features, generator=gen).to(layer.dtype)
    want = layer(x)
    layer.attach_w4a8(parts)
    try:
        got = layer(x)
        err = cpu_aot.relative_error(got, want)
        if got.shape != want.shape or not err <= 5e-2:
            raise RuntimeError(f"the int4 x int8 op disagrees with torch's int4 kernel "
                               f"(relative error {err:.2g})")
    except BaseException:
        layer.detach_w4a8()
        raise
    return True


def attach_decode_attention(model: LlamaModel, attn: Attention, mode: str) -> dict:
    """``attn.cpu_decode``: the paged decode kernel, where the step is eager on the CPU,
    the backend sdpa over a cache it serves (``Attention.cpu_decode_serves``), and the
    library loads and agrees with the torch path on a made-up cache; its ``_status``."""
    attn.cpu_decode = None
    if mode == "off":
        return _status("off", "--cpu-aot-kernels off")
    if model.device.type != "cpu" or not attn.cpu_decode_serves():
        return _status("not used", "the sdpa backend on the CPU over a cache in the model "
                       "dtype (bf16 / float32) or int8, 16 to 256 dims a head (powers of two), "
                       "up to 8 query heads a KV head")
    if model.compiled_pieces:
        return _status("not used", "--compile: the compiled step keeps the torch path")
    kernel, status = _library(
        "the paged decode attention", cpu_paged_decode, mode,
        lambda directory: _checked_decode(cpu_paged_decode.load(directory), attn))
    attn.cpu_decode = kernel
    return status


def _checked_decode(kernel: cpu_paged_decode.PagedDecode, attn: Attention
                    ) -> cpu_paged_decode.PagedDecode:
    """The kernel against the torch path (gather + SDPA) on a small made-up cache of the
    model's shapes, through the attention layer as a step runs it (the step's K/V stored,
    then its decode rows attended): three rows of 1, 70 and 200 positions over scattered
    blocks, on twin caches that must hold the same bits afterwards."""
    cache = attn.kv_cache
    gen = torch.Generator().manual_seed(0)
    bs, kvh, hd = cache.block_size, attn.num_kv_heads, attn.head_dim
    lens = torch.tensor([1, 70, 200], dtype=torch.int32)
    width = -(-200 // bs)
    twins = [KVCache(1, 3 * width, bs, kvh, hd, cache.model_dtype, cache.kv_cache_dtype,
                     torch.device("cpu"), kernel_layout=False) for _ in range(2)]
    slots = torch.arange(3 * width * bs)
    k, v = torch.randn(2, len(slots), kvh, hd, generator=gen).to(cache.model_dtype)
    for twin in twins:
        twin.write(0, slots, k, v)
    tables = torch.randperm(3 * width, generator=gen).view(3, width).to(torch.int32)
    # each row's last position is this step's token, written by the step itself
    last = (tables[torch.arange(3), (lens.long() - 1) // bs].long() * bs
            + (lens.long() - 1) % bs)
    q = torch.randn(3, attn.num_heads, hd, generator=gen).to(cache.model_dtype)
    step_k, step_v = torch.randn(2, 3, kvh, hd, generator=gen).to(cache.model_dtype)
    outs = []
    for twin, lib in zip(twins, (None, kernel)):
        layer = Attention(attn.num_heads, kvh, hd, "sdpa", twin)
        layer.cpu_decode = lib
        meta = AttentionMetadata(last, tables, lens, torch.arange(4, dtype=torch.int32),
                                 num_decode=3, max_decode_context=200, min_decode_context=1)
        outs.append(layer.forward(0, q, step_k, step_v, layer.prepare(meta)))
    want, got = outs
    err = cpu_aot.relative_error(got, want)
    same = all(torch.equal(a, b) for a, b in zip(*((t.data, t.scales) for t in twins))
               if a is not None)
    if got.shape != want.shape or not err <= 2e-2 or not same:
        raise RuntimeError(f"{kernel.path.name} disagrees with the torch path (relative "
                           f"error {err:.2g}, the caches' bits {'' if same else 'not '}the "
                           "same)")
    return kernel


def _library(what: str, module: ModuleType, mode: str, load: Callable[[Path], T]
             ) -> tuple[T | None, dict]:
    """One of our C++ libraries (``module``: its ``why_not_here``, ``library_name`` and
    ``build``) from the kernels directory: ``load(directory)`` (it checks too), built first
    where ``mode`` says so; (what ``load`` gave or None, its ``_status``)."""
    why = module.why_not_here()
    if why is not None:
        return None, _status("not used", why)
    directory = kernels_dir()
    return _load_or_build(what, directory / module.library_name(), mode,
                          lambda: module.build(directory), lambda: load(directory))


def _status(status: str, reason: str = "", path: Path | None = None,
            seconds: float | None = None) -> dict:
    return {"status": status, "reason": reason, "path": None if path is None else str(path),
            "build_seconds": None if seconds is None else round(seconds, 2)}


def _load_or_build(what: str, path: Path, mode: str, build: Callable[[], float],
                   load: Callable[[], T]) -> tuple[T | None, dict]:
    """The package at ``path`` loaded (``load`` also checks it), compiled first where it is
    missing and ``mode`` is build: (what ``load`` gave or None, its ``_status``)."""
    seconds = None
    try:
        if not path.is_file() and mode == "build":
            log.info("compiling %s ahead of time into %s (once per machine)", what,
                     path.parent)
            seconds = build()
            log.info("compiled in %.1f s", seconds)
        if not path.is_file():
            log.info("%s: eager, no %s (%s)", what, path.name, BUILD_HINT)
            return None, _status("not built", f"no {path.name} in {path.parent}; {BUILD_HINT}")
        loaded = load()
    except Exception as exc:  # a compiler missing, a package from elsewhere: eager
        log.warning("%s is not used: %s", what, exc)
        return None, _status("failed", str(exc)[:500], seconds=seconds)
    return loaded, _status("built" if seconds is not None else "loaded", "", path, seconds)


def attach_layers(model: LlamaModel, mode: str) -> tuple[dict, dict]:
    """The layer pieces for one-row steps and for steps of 2+ rows: their ``_status``."""
    model.one_token_layers = model.few_rows_layers = None
    if mode == "off":
        off = _status("off", "--cpu-aot-kernels off")
        return off, off
    why = aot_layers.unusable(model)
    if why is not None:
        return _status("not used", why), _status("not used", why)
    found = []
    for rows, path in aot_layers.package_paths(model, kernels_dir()):
        span = "one row" if rows == (1, 1) else f"{rows[0]}-{rows[1]} rows"
        pieces, status = _load_or_build(
            f"the layer pieces ({span})", path, mode,
            lambda r=rows, p=path: aot_layers.build(model, p, r),
            lambda r=rows, p=path: aot_layers.LayerPieces(p, model, r))
        found.append((rows, pieces, status))
    model.one_token_layers = found[0][1]
    one = found[0][2]
    if len(found) < 2:
        return one, _status("not used", "the layers switch to their dense copies from 2 rows")
    rows, model.few_rows_layers, few = found[1]
    return one, {**few, "rows": list(rows)}


def attach_head(model: LlamaModel, mode: str, int8_rows: bool = False) -> AotKernels:
    """The int8 LM head's kernel on the CPU: with ``int8_rows`` (torch's int8 kernel is
    unvectorised here) ``cpu_int8_rows`` for every call where it serves the head's weights,
    else the one-row GEMV package; its status."""
    head = model.lm_head
    if mode == "off":
        return AotKernels(mode, "off", "--cpu-aot-kernels off")
    if not (isinstance(head, Int8Linear) and head.device.type == "cpu"
            and head.kernel != "unloaded" and head.dtype in cpu_aot.DTYPES):
        return AotKernels(mode, "not used", "only an int8 LM head on the CPU has one")
    if "LlamaModel.head" in model.compiled_pieces:
        # torch.compile cannot trace into the package: the compiled head runs torch's kernel
        head.one_row = None
        return AotKernels(mode, "not used", "--compile: the compiled head runs torch's kernel")
    if int8_rows and cpu_int8_rows.Int8Rows.serves(head.q, head.scale):
        head.one_row, status = _library(
            "the LM head's int8 rows kernel", cpu_int8_rows, mode,
            lambda directory: _checked(cpu_int8_rows.load(directory), head))
    else:
        (n, k), dtype, directory = head.weight_shape, head.dtype, kernels_dir()
        head.one_row, status = _load_or_build(
            f"the LM head's one-row int8 GEMV ({n} x {k})",
            directory / cpu_aot.package_name(n, k, dtype), mode,
            lambda: cpu_aot.build(directory, n, k, dtype)[1],
            lambda: _checked(cpu_aot.load(directory, n, k, dtype), head))
    return AotKernels(mode, status["status"], status["reason"], status["path"],
                      status["build_seconds"])


def _checked(kernel: K, head: Int8Linear) -> K:
    """The kernel against torch's kernel on the head's own weights, one random row."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, head.in_features, generator=gen).to(head.dtype)
    got = kernel(x, head.q, head.scale)
    want = torch._weight_int8pack_mm(x, head.q, head.scale)
    err = cpu_aot.relative_error(got, want)
    if got.shape != want.shape or not err <= 2e-2:
        raise RuntimeError(f"{kernel.path.name} disagrees with torch's int8 kernel "
                           f"(shape {tuple(got.shape)}, relative error {err:.2g})")
    return kernel
