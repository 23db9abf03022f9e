"""Which attention kernel really runs, found at start-up (a flash kernel must be verified to
run: SDPA must not fall back silently).

- ``auto`` resolves to ``triton`` on CUDA and ``sdpa`` on the CPU.
- ``triton``: our paged kernels (backend.layers.triton_attention), run once at start-up on
  a tiny paged cache so a broken Triton install fails here, not in the first request.
  Reported as ``triton``, or ``triton_interpreter`` when ``TRITON_INTERPRET=1`` runs them
  on the CPU (the only way they run there).
- ``math``: our explicit matmul + softmax reference (attention.math_attention).
- ``sdpa`` on CUDA: each SDPA backend is tried in turn (flash, cuDNN, efficient, math),
  restricted with ``torch.nn.attention.sdpa_kernel`` on inputs shaped like the engine's
  (additive float mask, GQA folded into the query axis); the first that runs is kept and every
  later call is restricted to it, so a shape it cannot handle raises instead of silently
  taking another kernel.
- ``sdpa`` on CPU: torch picks between its CPU flash kernel and math by dtype and inputs;
  we ask its dispatcher (``torch._fused_sdp_choice``) for the engine's decode and prefill
  shapes and report that, without restricting per call (the context manager's cost per
  layer is not worth it where the choice is deterministic).
"""
from __future__ import annotations

import contextlib
import functools
import warnings
from typing import Callable

import torch
import torch.nn.functional as F

from backend.layers.attention import triton_attention
from backend.layers.kv_cache import kv_storage_dtype

_CHOICE_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def _probe_inputs(device: torch.device, dtype: torch.dtype, kvh: int, group: int, hd: int
                  ) -> list[tuple[torch.Tensor, ...]]:
    """A decode-shaped and a prefill-shaped call, as Attention makes them."""
    ctx = 48
    dec = (torch.randn(2, kvh, group, hd, device=device, dtype=dtype),
           torch.randn(2, kvh, ctx, hd, device=device, dtype=dtype),
           torch.randn(2, kvh, ctx, hd, device=device, dtype=dtype),
           torch.zeros(2, 1, 1, ctx, dtype=dtype, device=device))
    pre = (torch.randn(1, kvh, group * 16, hd, device=device, dtype=dtype),
           torch.randn(1, kvh, ctx, hd, device=device, dtype=dtype),
           torch.randn(1, kvh, ctx, hd, device=device, dtype=dtype),
           torch.zeros(1, 1, group * 16, ctx, dtype=dtype, device=device))
    return [dec, pre]


def resolve_attention(backend: str, device: torch.device) -> str:
    """``auto`` -> triton on CUDA, sdpa elsewhere; triton on the CPU needs the interpreter."""
    if backend == "auto":
        return "triton" if device.type == "cuda" and triton_attention is not None else "sdpa"
    if backend == "triton":
        if triton_attention is None:
            raise ValueError("attention 'triton' needs the triton package (pip install triton)")
        if device.type != "cuda" and not triton_attention.interpreting():
            raise ValueError("attention 'triton' on the CPU runs only under the Triton "
                             "interpreter: set TRITON_INTERPRET=1 (slow; for checking)")
    return backend


def _probe_triton(device: torch.device, dtype: torch.dtype, kvh: int, group: int,
                  hd: int, kv_cache_dtype: str, block_size: int) -> str:
    """A two-token prefill and decode through every kernel on a one-block cache. On CUDA
    every split count the engine can pick is run too: each is its own compiled kernel, and
    compiling it here keeps the compile time out of the first steps that use it."""
    cache = torch.zeros(block_size, 2, kvh, hd, dtype=kv_storage_dtype(kv_cache_dtype, dtype),
                        device=device)
    scales = None
    if kv_cache_dtype != "auto":
        scales = torch.zeros(2, kvh, block_size, dtype=torch.float32, device=device)
    k = torch.randn(2, kvh, hd, dtype=dtype, device=device)
    q = torch.randn(2, kvh * group, hd, dtype=dtype, device=device)
    triton_attention.store_kv(k, k, torch.arange(2, device=device), cache, scales,
                              kv_cache_dtype, block_size)
    out = torch.empty_like(q)
    table = torch.zeros(1, 1, dtype=torch.int32, device=device)
    lens = torch.full((1,), 2, dtype=torch.int32, device=device)
    starts = torch.tensor([0, 2], dtype=torch.int32, device=device)
    args = (hd ** -0.5, block_size, kv_cache_dtype)
    triton_attention.paged_prefill(q, cache, scales, table, lens, starts, out, *args)
    for splits in (1, 2, 4, 8, 16) if device.type == "cuda" else (1,):
        triton_attention.paged_decode(q[:1], cache, scales, table, lens, out, *args, splits)
    if not torch.isfinite(out).all():
        raise RuntimeError("the Triton attention kernels returned non-finite values at start-up")
    return "triton_interpreter" if device.type != "cuda" else "triton"


def probe_attention_kernel(backend: str, device: torch.device, dtype: torch.dtype, kvh: int,
                           group: int, hd: int, kv_cache_dtype: str = "auto",
                           block_size: int = 16
                           ) -> tuple[str, Callable[[], contextlib.AbstractContextManager] | None]:
    """backend: triton | sdpa | math (resolved) -> (kernel name for
    EngineStats.attention_kernel, per-call SDPA context or None)."""
    if backend == "math":
        return "math", None
    if backend == "triton":
        return _probe_triton(device, dtype, kvh, group, hd, kv_cache_dtype, block_size), None
    probes = _probe_inputs(device, dtype, kvh, group, hd)
    if device.type != "cuda":
        return _cpu_choice(probes), None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    order = [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION),
             ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("math", SDPBackend.MATH)]
    for name, which in order:
        try:
            # a refusing backend warns why before raising; the refusal is the answer here
            with sdpa_kernel([which]), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                for q, k, v, m in probes:
                    F.scaled_dot_product_attention(q, k, v, attn_mask=m)
            torch.cuda.synchronize(device)
        except RuntimeError:
            continue
        return name, functools.partial(sdpa_kernel, [which])
    raise RuntimeError("no SDPA backend runs the engine's attention shapes on this device")


def _cpu_choice(probes: list[tuple[torch.Tensor, ...]]) -> str:
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return "cpu_unknown"
    names = []
    for q, k, v, m in probes:
        names.append(_CHOICE_NAMES.get(int(choose(q, k, v, attn_mask=m)), "unknown"))
    kinds = sorted(set(names))
    return "cpu_" + "+".join(kinds)
