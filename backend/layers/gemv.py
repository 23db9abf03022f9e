"""One-token matmuls (CUDA, Triton) with the elementwise work before them fused in.

At one token per step a linear layer is a GEMV bound by its weight bytes, and the small
kernels between the GEMVs (residual add + RMSNorm, SiLU(gate) * up) cost more in launches
and drained waves than in bytes: about 12 us per Llama-2-7B block on an H200. Here the
GEMV computes its own input from the previous layer's raw outputs (a *prologue*):

  * ``NONE``      a = x
  * ``NORM``      a = rms_norm(x) * norm_w                      (first block: no residual)
  * ``ADD_NORM``  s = x + residual; a = rms_norm(s) * norm_w;   s is the next residual
  * ``SILU_MUL``  a = silu(gate) * up                            (x = gate | up)

RMSNorm's scale 1 / sqrt(mean(s^2) + eps) is one number per token, so it is applied to the
finished dot products: y = rstd * (W @ (s * norm_w)); every program sums s^2 over the whole
row while it streams the weight, and nothing waits for a separate pass. The one rounding
the unfused path has and this one skips is the normed activation's to the model dtype (the
fused sums see it in fp32), so fused and unfused outputs agree to the dtype's precision,
not bit for bit. The residual s is written by the first program only (rounded to the dtype
as the unfused add does). SiLU·mul rounds as the unfused kernel does.

``Prologue`` carries the extra tensors; ``prologue_values`` is the shared piece the int8 /
int4 GEMVs (``quant_kernels``) call for their activations too. Under ``TRITON_INTERPRET=1``
the kernels run on CPU tensors (tests).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from backend.layers import pdl
from backend.layers.launch import fast

try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs
    triton = None

AVAILABLE = triton is not None and (torch.cuda.is_available()
                                    or os.environ.get("TRITON_INTERPRET") == "1")
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def runs_on(device: torch.device) -> bool:
    """Whether the GEMV runs for tensors on ``device`` (CUDA, or the CPU under the
    interpreter)."""
    return AVAILABLE and (device.type == "cuda" or INTERPRET)

NONE, NORM, ADD_NORM, SILU_MUL = 0, 1, 2, 3

# Tile shapes of the bf16/fp16 GEMV from ``benchmarks.one_token_gemv`` on an H200
# (docs/benchmarks/gemv/): DEFAULT was within 1 % of the fastest variant on every
# Llama-2-7B shape but qkv's, which has its own entry (keyed by (N, K)).
DEFAULT = dict(BLOCK_N=16, BLOCK_K=512, STAGES=3, num_warps=4)
CONFIGS: dict[tuple[int, int], dict] = {
    (12288, 4096): dict(BLOCK_N=32, BLOCK_K=256, STAGES=3, num_warps=4),
}


@dataclass(frozen=True)
class Prologue:
    """What turns the layer's raw input into the GEMV's activation. ``kind``: NONE, NORM,
    ADD_NORM or SILU_MUL; ``residual`` (ADD_NORM): the carried residual [1, K]; ``norm_w``
    / ``eps``: RMSNorm's weight [K] and epsilon (NORM, ADD_NORM); ``ss`` (NORM, optional):
    the sums of squares of x's parts, made by the kernel that wrote x
    (``linear.matmul_into_stream``), for a layer that finishes the norm with them
    (``Linear.one_token_normed``); the others compute the norm from x as for any NORM."""
    kind: int = NONE
    residual: torch.Tensor | None = None
    norm_w: torch.Tensor | None = None
    eps: float = 0.0
    ss: torch.Tensor | None = None

    @property
    def normed(self) -> bool:
        return self.kind in (NORM, ADD_NORM)

    def in_features(self, x: torch.Tensor) -> int:
        """The GEMV's K: x's width, or half of it for gate | up."""
        return x.shape[-1] // 2 if self.kind == SILU_MUL else x.shape[-1]

    def args(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                             torch.Tensor | None]:
        """(residual in, norm weight, residual out, the residual to return) for a kernel
        call: placeholders (x itself) where the kind has none, and no residual to return
        unless it is a norm. NORM carries x as the residual (the first block's input is the
        stream)."""
        if self.kind == ADD_NORM:
            out = torch.empty_like(x)
            return self.residual, self.norm_w, out, out
        if self.kind == NORM:
            return x, self.norm_w, x, x
        return x, x, x, None


if triton is not None:
    from backend.layers.pdl import release as pdl_release
    from backend.layers.pdl import wait as pdl_wait

    @triton.jit
    def prologue_values(x_ptr, r_ptr, nw_ptr, ro_ptr, off, k, mask, K, store_end,
                        PRO: tl.constexpr):
        """(a, s) in fp32 at element offsets ``off`` of x (and of the residuals), column
        ``k`` (broadcastable to ``off``; ``mask`` where in range): a the matmul's activation
        before RMSNorm's per-token scale, s the value whose squares make that scale (NORM /
        ADD_NORM). One token: off = k; rows: off = row * row stride + k (gate | up rows
        are 2K wide, residual rows K: the kinds never mix them). ADD_NORM writes s (the
        next residual) at columns below ``store_end`` (K in the programs that write it, 0
        in the others)."""
        if PRO == 3:  # SILU_MUL
            g = tl.load(x_ptr + off, mask=mask, other=0.0)
            u = tl.load(x_ptr + K + off, mask=mask, other=0.0)
            gf = g.to(tl.float32)
            act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # F.silu rounds to the dtype
            a = (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype).to(tl.float32)
            return a, a
        x = tl.load(x_ptr + off, mask=mask, other=0.0)
        if PRO == 2:  # ADD_NORM
            s = (x.to(tl.float32)
                 + tl.load(r_ptr + off, mask=mask, other=0.0).to(tl.float32)).to(x.dtype)
            tl.store(ro_ptr + off, s, mask=mask & (k < store_end))
            sf = s.to(tl.float32)
        else:
            sf = x.to(tl.float32)
        if PRO == 0:  # NONE
            return sf, sf
        return sf * tl.load(nw_ptr + k, mask=k < K, other=0.0).to(tl.float32), sf

    @triton.jit
    def norm_scale(ss, K, eps, PRO: tl.constexpr):
        """RMSNorm's 1 / sqrt(mean(s^2) + eps) from the summed squares (1 when not normed)."""
        if PRO == 1 or PRO == 2:  # NORM, ADD_NORM
            return 1.0 / tl.sqrt(ss / K + eps)
        return 1.0

    @fast
    @triton.jit
    def _gemv(x_ptr, r_ptr, nw_ptr, ro_ptr, w_ptr, s_ptr, b_ptr, y_ptr, N, K, eps,
              PRO: tl.constexpr, HAS_BIAS: tl.constexpr, FP8: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN: tl.constexpr,
              STAGES: tl.constexpr, PDL: tl.constexpr):
        # y[n] = rstd * sum_k W[n, k] a[k] (+ b[n]); one program per BLOCK_N rows streaming
        # [BLOCK_N, BLOCK_K] tiles of W (pipelined: STAGES), one fp32 partial per slot.
        # FP8: W is e4m3 codes (as bytes) times a float32 scale per row, s[n].
        pdl_wait(PDL)
        pid = tl.program_id(0)
        rn = pid * BLOCK_N + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
        ss = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            k = k0 + rk
            if EVEN:
                w = tl.load(w_ptr + rn[:, None] * K + k[None, :])
            else:
                w = tl.load(w_ptr + rn[:, None] * K + k[None, :],
                            mask=(rn[:, None] < N) & (k[None, :] < K), other=0.0)
            a, s = prologue_values(x_ptr, r_ptr, nw_ptr, ro_ptr, k, k, k < K, K,
                                   (pid == 0).to(tl.int32) * K, PRO)
            ss += s * s
            if FP8:
                w = w.to(tl.float8e4nv, bitcast=True)
            acc += w.to(tl.float32) * a[None, :]
        pdl_release(PDL)
        y = tl.sum(acc, axis=1) * norm_scale(tl.sum(ss, axis=0), K, eps, PRO)
        if FP8:
            y *= tl.load(s_ptr + rn, mask=rn < N, other=0.0)
        if HAS_BIAS:
            y += tl.load(b_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)
        tl.store(y_ptr + rn, y.to(y_ptr.dtype.element_ty), mask=rn < N)


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         prologue: Prologue = Prologue(), config: dict | None = None,
         scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x [1, K] (gate | up [1, 2K] for SILU_MUL) and weight [N, K] in one float dtype, or
    float8_e4m3fn codes with ``scale`` [N] float32 per row (W = codes * scale) ->
    (y [1, N], the residual to carry: s for ADD_NORM, x for NORM, else None)."""
    K = prologue.in_features(x)
    N = weight.shape[0]
    assert x.shape[0] == 1 and weight.shape[1] == K and x.is_contiguous()
    cfg = config or CONFIGS.get((N, K), DEFAULT)
    # The tiles were sized in bf16: fp32 weights take half the columns, so a pipeline stage
    # stays at the same bytes of shared memory (GPUs with ~100 KB per block fit 3 stages).
    bk = cfg["BLOCK_K"] // max(1, weight.element_size() // 2)
    bn, bk = cfg["BLOCK_N"], min(bk, triton.next_power_of_2(K))
    r_in, nw, r_out, carried = prologue.args(x)
    y = torch.empty(1, N, device=x.device, dtype=x.dtype)
    opts = {} if INTERPRET else dict(num_warps=cfg["num_warps"])
    fp8 = scale is not None
    if fp8:  # the bytes: the interpreter does not take float8 tensors; the kernel bitcasts
        weight = weight.view(torch.uint8)
    _gemv[(triton.cdiv(N, bn),)](
        x, r_in, nw, r_out, weight, scale if fp8 else weight,
        bias if bias is not None else weight, y, N, K, prologue.eps, PRO=prologue.kind,
        HAS_BIAS=bias is not None, FP8=fp8, BLOCK_N=bn, BLOCK_K=bk,
        EVEN=N % bn == 0 and K % bk == 0, STAGES=cfg["STAGES"], **opts, **pdl.launch(x.device))
    return y, carried
