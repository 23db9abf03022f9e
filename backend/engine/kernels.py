"""Which attention kernel really runs, found at start-up (a flash kernel must be verified to
run: SDPA must not fall back silently).

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

_CHOICE_NAMES = {0: "math", 1: "flash", 2: "efficient", 3: "cudnn", 4: "overrideable"}


def _probe_inputs(device: torch.device, dtype: torch.dtype, kvh: int, group: int, hd: int
                  ) -> list[tuple[torch.Tensor, ...]]:
    """A decode-shaped and a prefill-shaped call, as PagedAttention makes them."""
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


def probe_attention_kernel(backend: str, device: torch.device, dtype: torch.dtype, kvh: int,
                           group: int, hd: int
                           ) -> tuple[str, Callable[[], contextlib.AbstractContextManager] | None]:
    """-> (kernel name for EngineStats.attention_kernel, per-call SDPA context or None)."""
    if backend == "math":
        return "math", None
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
