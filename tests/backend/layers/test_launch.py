"""The fast Triton launch (backend.layers.launch): which launches reuse a compiled kernel,
what they hand its launcher, and when the JIT's own path runs instead. On the CPU against
a stand-in JIT function (the interpreter hands no compiled kernel back); on CUDA against
the real kernels, bit for bit."""
from __future__ import annotations

import inspect
import os

import pytest
import torch

from backend.layers import launch


class _Param:
    def __init__(self, p: inspect.Parameter, constexpr: bool):
        self.name, self.is_constexpr = p.name, constexpr
        self.default, self.has_default = p.default, p.default is not inspect.Parameter.empty


class _Compiled:
    function, packed_metadata = "fn", "meta"

    def __init__(self):
        self.launches = []
        self.run = lambda *a: self.launches.append(a)

    def launch_metadata(self, grid, stream, *values):
        return ("lm", grid)


class _Jit:
    """Stands in for a JIT function of (x, y, n, s, BLOCK: constexpr, FLAG: constexpr = 7):
    every launch through ``[grid]`` is recorded and hands back one compiled kernel per
    signature, as Triton's JIT does."""

    def __init__(self, trailing_constexpr: bool = True):
        def k(x, y, n, s, BLOCK, FLAG=7):
            pass
        sig = inspect.signature(k).parameters.values()
        self.params = [_Param(p, i >= 4 and trailing_constexpr) for i, p in enumerate(sig)]
        self.pre_run_hooks = []
        self.jit_calls = []
        self.compiled: dict = {}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            sig = tuple((a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor)
                        else type(a) for a in args) + tuple(sorted(kwargs.items()))
            return self.compiled.setdefault(sig, _Compiled())
        return run


@pytest.fixture
def on(monkeypatch):
    monkeypatch.setattr(launch, "ENABLED", True)
    monkeypatch.setattr(launch, "_driver_lookups", lambda: (lambda: 0, lambda d: 1234))


def test_second_launch_goes_to_the_compiled_kernel(on):
    jit = _Jit()
    k = launch.fast(jit)
    x, y = torch.zeros(64), torch.zeros(64)
    k[(3,)](x, y, 64, 0.5, BLOCK=32)
    assert len(jit.jit_calls) == 1
    (compiled,) = jit.compiled.values()
    assert compiled.launches == []  # the first launch was the JIT's own
    k[(3, 2)](x, y, 64, 0.25, BLOCK=32)  # another float value, another grid: same kernel
    assert len(jit.jit_calls) == 1
    (grid0, grid1, grid2, stream, fn, meta, lm, enter, exit_, *values), = compiled.launches
    assert (grid0, grid1, grid2, stream, fn, meta) == (3, 2, 1, 1234, "fn", "meta")
    assert (lm, enter, exit_) == (None, None, None)  # no launch hook set: nothing to call
    assert values[:4] == [x, y, 64, 0.25] and values[4:] == [32, 7]  # the constexpr, its default


def test_launch_hooks_get_what_the_jit_gives_them(on, monkeypatch):
    class Chain:  # Triton's HookChain: called on every launch while it holds a hook
        def __init__(self, calls):
            self.calls = calls

    class Runtime:
        launch_enter_hook, launch_exit_hook = Chain([print]), Chain([])

    monkeypatch.setattr(launch._knobs, "runtime", Runtime())
    jit = _Jit()
    k = launch.fast(jit)
    x = torch.zeros(8)
    for _ in range(2):
        k[(1,)](x, x, 8, 1.0, BLOCK=4)
    (compiled,) = jit.compiled.values()
    (*_, lm, enter, exit_), = [c[:9] for c in compiled.launches]
    assert lm == ("lm", (1,))
    assert enter is Runtime.launch_enter_hook and exit_ is Runtime.launch_exit_hook
    assert launch._idle(None) and launch._idle(Chain([])) and not launch._idle(print)


@pytest.mark.parametrize("change", ["dtype", "alignment", "int value", "int to float",
                                    "constexpr", "option", "device"])
def test_any_change_of_signature_goes_through_the_jit(on, change, monkeypatch):
    jit = _Jit()
    k = launch.fast(jit)
    x, y = torch.zeros(64), torch.zeros(64)
    base = dict(args=(x, y, 64, 0.5), kwargs=dict(BLOCK=32, num_warps=4))
    k[(1,)](*base["args"], **base["kwargs"])
    k[(1,)](*base["args"], **base["kwargs"])
    assert len(jit.jit_calls) == 1
    args, kwargs = list(base["args"]), dict(base["kwargs"])
    if change == "dtype":
        args[0] = x.double()
    elif change == "alignment":
        args[1] = y[1:]
    elif change == "int value":
        args[2] = 48
    elif change == "int to float":
        args[2] = 64.0
    elif change == "constexpr":
        kwargs["BLOCK"] = 64
    elif change == "option":
        kwargs["num_warps"] = 8
    else:
        k._device = lambda: 1
    k[(1,)](*args, **kwargs)
    assert len(jit.jit_calls) == 2
    k[(1,)](*args, **kwargs)  # and is kept under its own key
    assert len(jit.jit_calls) == 2


def test_layouts_the_key_does_not_cover_stay_with_the_jit(on):
    x = torch.zeros(8)
    jit = _Jit(trailing_constexpr=False)  # BLOCK could be a tensor given by keyword
    k = launch.fast(jit)
    for _ in range(2):
        k[(1,)](x, x, 8, 1.0, BLOCK=4)
    assert len(jit.jit_calls) == 2
    jit = _Jit()
    k = launch.fast(jit)
    for _ in range(2):
        k[(1,)](x, x, 8, [1.0], BLOCK=4)  # an argument of a kind the key does not know
    assert len(jit.jit_calls) == 2
    jit = _Jit()
    k = launch.fast(jit)
    k[(1,)](x, x, 8, 1.0, BLOCK=4)
    for _ in range(2):
        k[(1,)](x, 3, 8, 1.0, BLOCK=4)  # a scalar where a tensor was: never kept
        k[(1,)](x, x, x, 1.0, BLOCK=4)  # a tensor where a scalar was: never kept
    assert len(jit.jit_calls) == 5
    k[lambda meta: (1,)](x, x, 8, 1.0, BLOCK=4)  # a grid function: Triton's own launch
    assert len(jit.jit_calls) == 6


def test_off_is_the_jit(monkeypatch):
    monkeypatch.setattr(launch, "ENABLED", False)
    jit = _Jit()
    k = launch.fast(jit)
    x = torch.zeros(8)
    for _ in range(3):
        k[(1,)](x, x, 8, 1.0, BLOCK=4)
    assert len(jit.jit_calls) == 3
    assert k.params is jit.params  # the JIT function's attributes stay reachable


def test_the_table_is_bounded(on, monkeypatch):
    monkeypatch.setattr(launch, "MAX_ENTRIES", 4)
    k = launch.fast(_Jit())
    x = torch.zeros(8)
    for n in range(10):
        k[(1,)](x, x, n, 1.0, BLOCK=4)
    assert 1 <= k.entries() <= 4


def test_an_interpreted_kernel_stays_with_the_jit(on):
    jit = _Jit()
    del jit.params  # as Triton's InterpretedFunction: no parameter records
    k = launch.fast(jit)
    x = torch.zeros(8)
    for _ in range(2):
        k[(1,)](x, x, 8, 1.0, BLOCK=4)
    assert len(jit.jit_calls) == 2 and k.entries() == 0


@pytest.mark.skipif(not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
                    reason="needs CUDA and compiled Triton kernels")
def test_cuda_fast_launches_give_the_same_bits():
    from backend.layers import fused_ops
    from backend.layers import triton_attention as ta

    dev, dt = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(9, 4096 + 4, device=dev, dtype=dt, generator=g)
    res = torch.randn(9, 4096, device=dev, dtype=dt, generator=g)
    w = torch.randn(4096, device=dev, dtype=dt, generator=g)
    for view in (x[:, :4096], x[:, 4:]):  # aligned, then 8 bytes off
        want = fused_ops.add_rms_norm_triton(view, res, w, 1e-5)
        for _ in range(3):
            got = fused_ops.add_rms_norm_triton(view, res, w, 1e-5)
            assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert fused_ops._add_rms_norm_kernel.entries() >= 2  # one per alignment

    B, H, hd, bs, blocks = 8, 32, 128, 16, 64
    q = torch.randn(B, H, hd, device=dev, dtype=dt, generator=g)
    cache = torch.randn(blocks * bs, 2, H, hd, device=dev, dtype=dt, generator=g)
    tables = torch.arange(blocks, device=dev, dtype=torch.int32).view(B, blocks // B)
    for ctx in (100, 77):
        lens = torch.full((B,), ctx, device=dev, dtype=torch.int32)
        outs = []
        for _ in range(3):
            out = torch.empty_like(q)
            for splits in (1, 2):
                ta.paged_decode(q, cache, None, tables, lens, out, hd ** -0.5, bs, "auto",
                                splits)
                outs.append(out.clone())
        torch.cuda.synchronize()
        for i in range(2, 6):
            assert torch.equal(outs[i], outs[i % 2])
    assert ta._decode_kernel.entries() >= 2 and ta._merge_kernel.entries() >= 1
