"""The CPU's work between two attention calls of a step of few rows (layer i's o, add +
RMSNorm, gate|up, SiLU·mul and down, then layer i + 1's add + RMSNorm, q|k|v and RoPE),
compiled ahead of time (``backend.layers.cpu_aot``) into a package that serves every pair of
layers: their weights are its inputs. A decode step on the CPU runs ~15 torch ops a layer,
each paying Python and dispatch, around matmuls of a few dozen µs; the compiled piece runs
them as one call with the elementwise work fused (SmolLM2's 29 pairs, ad hoc on a 2-core VM:
about half the time of the same calls eager at one row, 3.4-4.4 ms less at 2-8 rows).

Two packages per model: one for one-row steps (batch-1 decode), compiled for exactly one row,
and one for 2 up to the rows from which the quantised layers switch to their dense copies
(``cpu_dequant.few_rows_limit``: 31 for int4 layers on the int4 x int8 op, 8 on torch's
int4 kernel, 3 for int8), compiled with the row count
dynamic (at one row that form cost ~4 % more, hence two).

The package bakes in today's layer code, so its name carries a digest of the sources it was
traced from, beside the shapes, dtypes, torch build and CPU: a change to any of them makes
the engine look for (and ``build`` compile) another one.
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.export import Dim

from backend import model as model_module
from backend.layers import cpu_aot, cpu_dequant, cpu_w4a8, fused_ops, gemv, linear, quantize
from backend.model import DecoderLayer, LlamaModel

# the code the traced graph comes from: the layer methods, the matmuls' CPU paths and their
# row thresholds, the ops
SOURCES = (model_module, linear, cpu_dequant, cpu_w4a8, fused_ops, gemv, quantize)


class _Between(nn.Module):
    """(attention output of layer a, residual, cos, sin) -> layer b's q, k, v, residual."""

    def __init__(self, a: DecoderLayer, b: DecoderLayer) -> None:
        super().__init__()
        self.a, self.b = a, b

    def forward(self, out: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y, residual = self.a.post_attention(out, residual)
        return self.b.pre_attention(y, residual, cos, sin)


class _Lifted(nn.Module):
    """``_Between`` with the two layers' tensors as the leading inputs (in ``names`` order)."""

    def __init__(self, inner: _Between, names: list[str]) -> None:
        super().__init__()
        self.inner, self.names = inner, names

    def forward(self, *args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        n = len(self.names)
        return torch.func.functional_call(self.inner, dict(zip(self.names, args[:n])),
                                          args[n:])


def _tensors(pair: _Between) -> dict[str, torch.Tensor]:
    # the kept dense copies (oneDNN's opaque layout) serve many-row calls only
    found = dict(pair.named_parameters())
    found.update((n, b) for n, b in pair.named_buffers() if not n.endswith("prefill_weight"))
    return found


def _pairs(model: LlamaModel) -> list[_Between]:
    return [_Between(a, b) for a, b in zip(model.layers, model.layers[1:])]


def unusable(model: LlamaModel) -> str | None:
    """Why this model's steps of few rows cannot run the compiled pieces, or None."""
    if model.device.type != "cpu":
        return "the CPU's eager step only"
    if model.compiled_pieces or model.ops is not model_module.EAGER or not model.flat_eager:
        return "the step ops are not the eager ones (--compile or fused ops)"
    if not isinstance(model.layers[0].qkv, (linear.Int4Linear, linear.Int8Linear)):
        return "measured for int4 / int8 layers only (dense layers run eager)"
    if len(model.layers) < 2:
        return "one layer: nothing between two attention calls"
    shapes = [{n: (t.shape, t.dtype) for n, t in _tensors(p).items()} for p in _pairs(model)]
    if any(s != shapes[0] for s in shapes):
        return "the layers differ in their weights' shapes or formats"
    return None


def _row_ranges(model: LlamaModel) -> list[tuple[int, int]]:
    """The packages' row ranges (first, last) for this model's layers: one row, then 2 up
    to the last row before the layers switch kernels (none where that is 1)."""
    qkv = model.layers[0].qkv
    kind = qkv.cpu_kind if isinstance(qkv, linear.Int4Linear) else "int8"
    last = cpu_dequant.few_rows_limit(kind) - 1
    return [(1, 1)] + ([(2, last)] if last >= 2 else [])


def package_paths(model: LlamaModel, directory: Path) -> list[tuple[tuple[int, int], Path]]:
    """(rows (first, last), package) for each of this model's row ranges: named for its
    layer shapes, formats, kernels and dtype, the rows, the layer code of this tree (hashed once for
    all the ranges), the torch build and the CPU."""
    h = hashlib.sha256()
    pair = _pairs(model)[0]
    for name, t in sorted(_tensors(pair).items()):
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype};".encode())
    # the kernels the traced calls take (the int4 x int8 op and its activation parts)
    h.update("|".join(m.kernel for m in pair.modules() if isinstance(m, linear.Linear)).encode())
    cfg = model.cfg
    h.update(f"{model.dtype}|{cfg.num_attention_heads}|{cfg.num_key_value_heads}|"
             f"{cfg.head_dim}|{cfg.rms_norm_eps}|{torch.__version__}|".encode())
    for module in SOURCES:
        h.update(Path(module.__file__).read_bytes())
    digest = f"{h.hexdigest()[:16]}-{cpu_aot.cpu_tag()}"
    paths = []
    for rows in _row_ranges(model):
        kind = "one-token" if rows == (1, 1) else f"rows-{rows[0]}-{rows[1]}"
        paths.append((rows, Path(directory) / f"layers-{kind}-{digest}.pt2"))
    return paths


def _example(model: LlamaModel, rows: int = 1) -> tuple[torch.Tensor, ...]:
    cfg, dt = model.cfg, model.dtype
    gen = torch.Generator().manual_seed(0)
    out = torch.randn(rows, cfg.num_attention_heads * cfg.head_dim, generator=gen).to(dt)
    residual = torch.randn(rows, cfg.hidden_size, generator=gen).to(dt)
    return out, residual, model.cos_table[7:7 + rows], model.sin_table[7:7 + rows]


def build(model: LlamaModel, path: Path, rows: tuple[int, int] = (1, 1)) -> float:
    """Compiles the package for this model at ``rows`` (``package_paths``) into ``path``;
    the seconds."""
    pair = _pairs(model)[0]
    tensors = _tensors(pair)
    names = sorted(tensors)
    first, last = rows
    dynamic = None
    if last > first:  # the activations' row count a symbol in [first, last]
        dim = Dim("rows", min=first, max=last)
        dynamic = {"args": (*(None for _ in names), *({0: dim} for _ in range(4)))}
    # the dense copies the layers may keep are not inputs, and export cannot lift them as
    # constants (oneDNN's opaque layout): set aside while tracing
    kept = [(m, m.prefill_weight) for m in pair.modules()
            if isinstance(m, linear.Linear) and getattr(m, "prefill_weight", None) is not None]
    try:
        for m, _ in kept:
            m.prefill_weight = None
        return cpu_aot.compile_package(
            path, _Lifted(pair, names).eval(),
            (*(tensors[n] for n in names), *_example(model, last)), dynamic)
    finally:
        for m, copy in kept:
            m.prefill_weight = copy


class LayerPieces:
    """``pieces(i, out, residual, cos, sin)``: between attention calls i and i + 1 of a step
    of ``rows`` (first, last) rows -> (q, k, v, residual) of layer i + 1, through the
    package."""

    def __init__(self, path: Path, model: LlamaModel, rows: tuple[int, int] = (1, 1)) -> None:
        self.path, self.rows = path, rows
        self.max_rows = rows[1]
        self._run: Callable[[list[torch.Tensor]], list[torch.Tensor]] = \
            cpu_aot.load_runner(path)
        self._pairs = _pairs(model)
        self._names = sorted(_tensors(self._pairs[0]))
        self._signature = [(t.shape, t.dtype) for t in self._bind()[0]]
        for n in sorted(set(rows)):
            self._check(self._pairs[0], model, n)

    def _bind(self) -> list[list[torch.Tensor]]:
        """Each pair's tensors in the package's input order, as the layers hold them now
        (``.to`` and reloads replace them: ``Linear.generation`` moves)."""
        self._weights = [[t[n] for n in self._names] for t in map(_tensors, self._pairs)]
        self._generation = linear.Linear.generation
        return self._weights

    def __call__(self, i: int, out: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> list[torch.Tensor]:
        if self._generation != linear.Linear.generation:
            if [(t.shape, t.dtype) for t in self._bind()[0]] != self._signature:
                raise RuntimeError(f"{self.path.name} was compiled for other weight shapes "
                                   "or dtypes than the layers hold now")
        return self._run([*self._weights[i], out, residual, cos, sin])

    def _check(self, pair: _Between, model: LlamaModel, rows: int) -> None:
        """The package against the eager calls on the first pair's own weights."""
        args = _example(model, rows)
        with torch.inference_mode():
            want = pair(*args)
            got = self(0, *args)
        for g, w in zip(got, want):
            err = cpu_aot.relative_error(g, w)
            if g.shape != w.shape or not err <= 5e-2:
                raise RuntimeError(f"{self.path.name} disagrees with the eager layers at "
                                   f"{rows} rows (shape {tuple(g.shape)}, relative error "
                                   f"{err:.2g})")
