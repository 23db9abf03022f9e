"""The CPU code the engine runs compiled ahead of time (``backend.layers.cpu_aot``) in
one-token steps: the int8 LM head's one-row GEMV and the quantised layers' work between
attention calls (``backend.engine.aot_layers``). Packages live in the weights cache,
``$FIRSTTOKEN_CACHE/kernels`` (default ``~/.cache/firsttoken/kernels``), one per shape and
machine; ``make model`` builds the embedded model's. At start the engine loads a package
that is there (``--cpu-aot-kernels auto``), compiles a missing one first (``build``, 10-40 s
once) or runs the eager path (``off``, and wherever no package loads);
``python -m backend.engine.build_kernels`` builds a model's packages and exits.
"""
from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from backend.engine import aot_layers
from backend.layers import cpu_aot
from backend.layers.linear import Int8Linear
from backend.model import LlamaModel
from backend.weights.paths import cache_root

log = logging.getLogger(__name__)

MODES = ("auto", "build", "off")
BUILD_HINT = "python -m backend.engine.build_kernels --model MODEL builds it"


@dataclass(frozen=True)
class AotKernels:
    """What became of the LM head's compiled one-row kernel (``/health``), and in
    ``layers`` of the one-token layer pieces (``backend.engine.aot_layers``), the same
    fields: {"status", "reason", "path", "build_seconds"}."""

    mode: str  # --cpu-aot-kernels
    lm_head: str  # loaded, built, not built, not used, off, failed
    reason: str = ""
    path: str | None = None
    build_seconds: float | None = None
    layers: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return asdict(self)


def kernels_dir() -> Path:
    return cache_root() / "kernels"


def attach(model: LlamaModel, mode: str) -> AotKernels:
    """Gives the model on the CPU its compiled one-token kernels, per ``mode``, after the
    step ops are chosen (compiled step ops get none): the int8 LM head's one-row GEMV and
    the layer pieces between attention calls. A package that does not load, or whose output
    differs from the eager path's on the model's own weights, is not used (the engine runs
    the eager path and says why)."""
    head = attach_head(model, mode)
    return replace(head, layers=attach_layers(model, mode))


def attach_layers(model: LlamaModel, mode: str) -> dict:
    model.one_token_layers = None
    if mode == "off":
        return {"status": "off", "reason": "--cpu-aot-kernels off", "path": None,
                "build_seconds": None}
    why = aot_layers.unusable(model)
    if why is not None:
        return {"status": "not used", "reason": why, "path": None, "build_seconds": None}
    directory, seconds = kernels_dir(), None
    path = aot_layers.package_path(model, directory)
    try:
        if not path.is_file() and mode == "build":
            log.info("compiling the one-token layer pieces ahead of time into %s (once per "
                     "machine and layer code)", directory)
            _, seconds = aot_layers.build(model, directory)
            log.info("compiled in %.1f s", seconds)
        if not path.is_file():
            log.info("one-token steps run the eager layers: no %s (%s)", path.name, BUILD_HINT)
            return {"status": "not built", "reason": f"no {path.name} in {directory}; "
                    f"{BUILD_HINT}", "path": None, "build_seconds": None}
        model.one_token_layers = aot_layers.OneTokenLayers(path, model)
    except Exception as exc:  # as for the head: the eager layers serve
        log.warning("the compiled one-token layer pieces are not used: %s", exc)
        return {"status": "failed", "reason": str(exc)[:500], "path": None,
                "build_seconds": None if seconds is None else round(seconds, 2)}
    return {"status": "built" if seconds is not None else "loaded", "reason": "",
            "path": str(path), "build_seconds": None if seconds is None else round(seconds, 2)}


def attach_head(model: LlamaModel, mode: str) -> AotKernels:
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
    n, k = head.weight_shape
    directory, seconds = kernels_dir(), None
    try:
        kernel = cpu_aot.load(directory, n, k, head.dtype)
        if kernel is None and mode == "build":
            log.info("compiling the LM head's one-row int8 GEMV (%d x %d) ahead of time "
                     "into %s (once per machine)", n, k, directory)
            _, seconds = cpu_aot.build(directory, n, k, head.dtype)
            log.info("compiled in %.1f s", seconds)
            kernel = cpu_aot.load(directory, n, k, head.dtype)
        if kernel is None:
            name = cpu_aot.package_name(n, k, head.dtype)
            log.info("the LM head runs torch's int8 kernel: no %s in %s (%s)", name, directory,
                     BUILD_HINT)
            return AotKernels(mode, "not built", f"no {name} in {directory}; {BUILD_HINT}")
        _check(kernel, head)
    except Exception as exc:  # a compiler missing, a package from elsewhere: torch's kernel
        log.warning("the LM head's compiled GEMV is not used: %s", exc)
        return AotKernels(mode, "failed", str(exc)[:500], build_seconds=seconds)
    head.one_row = kernel
    return AotKernels(mode, "built" if seconds is not None else "loaded", "", str(kernel.path),
                      None if seconds is None else round(seconds, 2))


def _check(kernel: cpu_aot.OneRowInt8, head: Int8Linear) -> None:
    """The package against torch's kernel on the head's own weights, one random row."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(1, head.in_features, generator=gen).to(head.dtype)
    got = kernel(x, head.q, head.scale).float()
    want = torch._weight_int8pack_mm(x, head.q, head.scale).float()
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-6)
    if got.shape != want.shape or not err <= 2e-2:
        raise RuntimeError(f"{kernel.path.name} disagrees with torch's int8 kernel "
                           f"(shape {tuple(got.shape)}, relative error {err:.2g})")
