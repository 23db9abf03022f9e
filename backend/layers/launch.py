"""Launching our Triton kernels with less host time.

``kernel[grid](...)`` through Triton's JIT binds every argument and specialises it (dtype,
16-byte alignment, integers equal to 1 or multiples of 16), then builds a cache key from
the specialisation and ``str`` of the options, reads the debug knobs, checks the kernel's
globals and makes launch metadata: 13-15 µs of host time for a 12-argument kernel on an
H200's or H100's host against 6-7 for a torch op, and more for the decode attention's 33
arguments (10 µs for the 12-argument kernel through this module: docs/BENCHMARKS.md,
"Triton launches without the JIT's binding").
Inside a CUDA graph that cost is paid once at capture; outside one the host launches every
kernel of a step (two to six of ours a layer, with cuBLAS and torch ops between), and at
small batches the host is what the step waits for.

``fast`` wraps a ``@triton.jit`` kernel with the same ``kernel[grid](...)`` call. The first
launch of each argument signature goes through the JIT (compiling, caching, checking) and
keeps the compiled kernel it returns; later launches with the same signature hand the
arguments to that kernel's launcher directly. The signature is a key that determines
Triton's specialisation: for a tensor its dtype and its address modulo 16, for an integer
its exact value, for every scalar its type, and every keyword argument (the constexprs and
launch options) by value, with the current device. A key finer than Triton's own costs
only cache entries (bounded below), never a wrong kernel. The launch itself is the JIT's
launch line; its launch metadata, which only launch hooks read, is made only while a hook
is set (a profiler's). The JIT's check that the kernel's globals have not changed since it
was compiled is not repeated: ours are fixed at import.

Not taken (the JIT's own path runs): Triton's interpreter, Triton versions whose JIT does
not return the compiled kernel, kernels with pre-run hooks, signatures with a non-constexpr
argument passed by keyword, and arguments of types the key does not know.
``FIRSTTOKEN_FAST_LAUNCH=0`` turns it off (for A/B measurements).
"""
from __future__ import annotations

import os
from typing import Any

import torch

try:
    from triton import knobs as _knobs
except ImportError:  # no Triton, or one before its knobs module (its launch takes other hooks)
    _knobs = None

ENABLED = os.environ.get("FIRSTTOKEN_FAST_LAUNCH", "1") != "0"

# Signatures kept per kernel before the table is cleared: integers are keyed by value,
# and a few (token counts, block-table widths) take many values over a server's life.
MAX_ENTRIES = 4096

_SCALARS = (int, float, bool)


def _arg_kind(a: Any) -> str | None:
    """How a positional argument enters the key: "t" tensor, "s" scalar, "n" None."""
    if isinstance(a, torch.Tensor):
        return "t"
    if a is None:
        return "n"
    if type(a) in _SCALARS:
        return "s"
    return None


def _key_function(kinds: tuple[str, ...]):
    """A function (device, kwargs, *args) -> the launch's key as one flat tuple, built once
    per kernel and call layout: one expression, no per-argument Python calls. The keyword
    arguments enter by value only: a layout fixes their names and order."""
    parts = ["_d"]
    for i, k in enumerate(kinds):
        if k == "t":  # dtype and alignment: what Triton specialises a pointer on
            parts.append(f"_a{i}.dtype, _a{i}.data_ptr() & 15")
        elif k == "s":  # an int by value (1, multiples of 16, i32/i64 range); a float by type
            parts.append(f"_a{i}.__class__, (_a{i} if _a{i}.__class__ is not float else 0)")
        else:
            parts.append(f"_a{i}")
    parts.append("*_kw.values()")  # constexprs and launch options
    params = ", ".join(["_d", "_kw", *(f"_a{i}" for i in range(len(kinds)))])
    src = f"def key({params}):\n    return ({', '.join(parts)},)\n"
    scope: dict = {}
    exec(src, scope)  # noqa: S102 - generated from argument kinds only
    return scope["key"]


def _idle(hook: Any) -> bool:
    """No launch hook to call: None, or an empty chain (Triton's ``HookChain``)."""
    return not getattr(hook, "calls", hook)


class FastKernel:
    """A ``@triton.jit`` kernel launched as ``kernel[grid](*args, **kwargs)``; see the
    module's docstring. ``fn`` is the JIT function (its attributes stay reachable)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        # (positional count, keyword names) -> (kinds, key function, {key: entry}) or None
        self._layouts: dict[tuple, tuple[tuple[str, ...], Any, dict] | None] = {}
        self._device = self._stream = None  # Triton's own lookups, bound on first use

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fn, name)

    def __getitem__(self, grid):
        if not ENABLED or callable(grid):
            return self.fn[grid]
        return lambda *args, **kwargs: self.launch(grid, args, kwargs)

    def launch(self, grid: tuple, args: tuple, kwargs: dict) -> None:
        """``kernel[grid](*args, **kwargs)``, through the compiled kernel's launcher when
        this signature has been launched before."""
        shape = (len(args), *kwargs)
        layout = self._layouts.get(shape, False)
        if layout is False:
            layout = self._layouts[shape] = self._layout(args)
        if layout is None:
            self.fn[grid](*args, **kwargs)
            return
        kinds, key_fn, entries = layout
        device = self._device()
        try:
            key = key_fn(device, kwargs, *args)
            entry = entries.get(key)
        except (AttributeError, TypeError):  # an argument of another kind at this place
            self.fn[grid](*args, **kwargs)
            return
        if entry is None:
            self._miss(entries, key, kinds, grid, args, kwargs)
            return
        kernel, tail = entry
        values = args + tail
        stream = self._stream(device)
        n = len(grid)
        g1, g2 = grid[1] if n > 1 else 1, grid[2] if n > 2 else 1
        enter, exit_ = _knobs.runtime.launch_enter_hook, _knobs.runtime.launch_exit_hook
        if _idle(enter) and _idle(exit_):  # nothing would read the launch metadata
            kernel.run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata,
                       None, None, None, *values)
        else:  # Triton's own launch line
            kernel.run(grid[0], g1, g2, stream, kernel.function, kernel.packed_metadata,
                       kernel.launch_metadata(grid, stream, *values), enter, exit_, *values)

    def _layout(self, args: tuple):
        """The key function for calls of this layout, or None where the fast path does not
        apply to this kernel or layout."""
        # an interpreted kernel (TRITON_INTERPRET) has no parameter records: nothing compiled
        if _knobs is None or getattr(self.fn, "pre_run_hooks", None) or \
                not hasattr(self.fn, "params"):
            return None
        self._device, self._stream = _driver_lookups()
        kinds = tuple(_arg_kind(a) for a in args)
        if None in kinds:
            return None
        # every parameter after the positional ones must be a constexpr (keyed by value)
        if any(not p.is_constexpr for p in self.fn.params[len(args):]):
            return None
        return kinds, _key_function(kinds), {}

    def _miss(self, entries: dict, key: tuple, kinds: tuple, grid: tuple, args: tuple,
              kwargs: dict) -> None:
        kernel = self.fn[grid](*args, **kwargs)  # Triton binds, compiles, checks, launches
        if not all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata",
                                                "launch_metadata")):
            return  # a JIT that does not hand the compiled kernel back
        if tuple(_arg_kind(a) for a in args) != kinds:
            return
        tail = []
        for p in self.fn.params[len(args):]:
            if p.name in kwargs:
                tail.append(kwargs[p.name])
            elif p.has_default:
                tail.append(p.default)
            else:
                return
        if len(entries) >= MAX_ENTRIES:
            entries.clear()
        entries[key] = (kernel, tuple(tail))

    def entries(self) -> int:
        """Signatures kept (all layouts): how many launches can take the fast path."""
        return sum(len(layout[2]) for layout in self._layouts.values() if layout)


def _driver_lookups():
    """Triton's current-device and current-stream functions (torch's, where torch is)."""
    from triton.runtime import driver
    return driver.active.get_current_device, driver.active.get_current_stream


def fast(fn: Any) -> FastKernel:
    """Decorator over ``@triton.jit``: launches through ``FastKernel``."""
    return FastKernel(fn)
