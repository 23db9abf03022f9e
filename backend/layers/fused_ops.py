"""The work of a decoder layer between its matmuls and attention, fused: residual add +
RMSNorm, RoPE on q and k in place, SiLU(gate) * up. Two implementations behind one
interface (``StepOps``): ``EAGER`` in plain torch ops (the reference, and the pieces
torch.compile fuses), ``TRITON`` as one small Triton kernel each (our own code; the same
schemes as vLLM's fused_add_rms_norm / rotary_embedding / silu_and_mul kernels).

The Triton kernels reproduce the eager rounding: every intermediate the torch ops round to
the activation dtype (the residual sum, x*cos and rotate(x)*sin, silu(gate)) is rounded the
same way here, so fused and eager steps agree to the last bit in most rows and greedy
decoding is unchanged. Under ``TRITON_INTERPRET=1`` they run on the CPU (tests).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from backend.layers import fp8_matmul, pdl
from backend.layers.launch import fast

try:
    import triton
    import triton.language as tl
    AVAILABLE = True
except ImportError:  # a CPU-only install without triton: the eager ops remain
    AVAILABLE = False


# ---------------------------------------------------------------- eager (torch) reference
def add_rms_norm_eager(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual: [T, hidden] -> (rms_norm(x + residual) * weight, x + residual).
    Without a residual (the first layer) x itself is normed and carried."""
    if residual is not None:
        x = x + residual
    if (x.device.type == "cpu" and x.dtype != torch.float32
            and not torch.compiler.is_compiling()):
        return _rms_norm_cpu(x, weight, eps), x
    return F.rms_norm(x, (x.shape[-1],), weight, eps), x


def _rms_norm_cpu(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) * weight [T, n] for bf16/fp16 x as layer_norm of the row [x, -x]: its
    mean is 0, so its variance is mean(x^2). On the CPU torch runs rms_norm as about 20
    dispatches (14 against 4 us for a 576-wide row) and layer_norm as one kernel.
    Both compute in float32 and round once to x's dtype; their sums run in another order,
    so about 1 value in 100,000 differs by one step (in float32 a third would differ by an
    ulp: float32 keeps rms_norm)."""
    n = x.shape[-1]
    y = F.layer_norm(torch.cat((x, -x), dim=-1), (2 * n,), _doubled(weight), None, eps)
    y = y[:, :n]
    return y if y.shape[0] == 1 else y.contiguous()  # the int4 kernels want dense rows


def _doubled(weight: torch.Tensor) -> torch.Tensor:
    """[weight, weight], kept on the tensor and rebuilt when it is written (load, copy_).
    An inference tensor has no version counter: built anew on each call."""
    if weight.is_inference():
        return torch.cat((weight, weight))
    kept = getattr(weight, "_firsttoken_doubled", None)
    if kept is None or kept[0] != weight._version:
        kept = (weight._version, torch.cat((weight, weight)))
        weight._firsttoken_doubled = kept
    return kept[1]


def rope_eager_(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """qk: [T, heads, hd] view (q heads then k heads), rotated in place (HF rotate_half
    layout); cos/sin: [T, hd]."""
    rope_signed_(qk, cos, signed_sin(sin))


def signed_sin(sin: torch.Tensor) -> torch.Tensor:
    """sin [T, hd] -> [-sin[:, :hd/2] | sin[:, hd/2:]]: rotate_half's negation moved onto
    the table, once a step instead of once a layer (x * -s is -(x * s), bit for bit)."""
    half = sin.shape[-1] // 2
    return torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)


def rope_signed_(qk: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> None:
    """``rope_eager_`` with the sine table from ``signed_sin``: four kernels (a copy of the
    halves swapped, two products in place, the sum); each product is rounded to qk's dtype
    before the sum, as in rotate_half's expression. Outside CUDA graphs the host launches
    each kernel: torch.roll on the strided q|k heads took a contiguous copy first on CUDA,
    and a negation followed (docs/BENCHMARKS.md, "The eager step's host cost")."""
    half = qk.shape[-1] // 2
    rotated = torch.cat((qk[..., half:], qk[..., :half]), dim=-1)  # [x2, x1], a new tensor
    rotated.mul_(sin_signed.unsqueeze(1))  # [-x2 * s, x1 * s]
    qk.mul_(cos.unsqueeze(1))
    qk.add_(rotated)


def silu_mul_eager(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [T, 2 * inter] (gate | up) -> silu(gate) * up [T, inter]."""
    inter = gate_up.shape[-1] // 2
    return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]


# ---------------------------------------------------------------- Triton kernels
if AVAILABLE:
    from backend.layers.fp8_matmul import store_e4m3_row
    from backend.layers.pdl import release as pdl_release
    from backend.layers.pdl import wait as pdl_wait

    @fast
    @triton.jit
    def _add_rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr, scale_ptr,
                             stride_x, stride_r, stride_o, stride_ro, N, eps,
                             HAS_RES: tl.constexpr, FP8_OUT: tl.constexpr, BLOCK: tl.constexpr,
                             PDL: tl.constexpr):
        # one program per row; the whole row (hidden <= BLOCK) lives in registers. FP8_OUT:
        # the normed row goes out as e4m3 codes (bytes at out) and a scale (at scale_ptr),
        # quantised from its model-dtype values as the unfused norm + quantiser would
        pdl_wait(PDL)
        pdl_release(PDL)
        row = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < N
        x = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0)
        if HAS_RES:
            r = tl.load(res_ptr + row * stride_r + cols, mask=mask, other=0.0)
            s = (x.to(tl.float32) + r.to(tl.float32)).to(x.dtype)  # rounded like eager x + r
            tl.store(res_out_ptr + row * stride_ro + cols, s, mask=mask)
            x = s
        xf = x.to(tl.float32)
        var = tl.sum(xf * xf, axis=0) / N
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        y = (xf * (1.0 / tl.sqrt(var + eps)) * w).to(x.dtype)
        if FP8_OUT:
            store_e4m3_row(out_ptr, scale_ptr, row, stride_o, cols, mask, y.to(tl.float32))
        else:
            tl.store(out_ptr + row * stride_o + cols, y, mask=mask)

    @triton.jit
    def rotate_halves(x1, x2, c, s):
        """RoPE (HF rotate_half) of a row's two halves x1, x2 [..., half] with float32
        cos/sin [1, half]: x * cos + cat(-x2, x1) * sin, each product rounded to the
        dtype first as the eager ops do. Shared with the KV-store kernel, which rotates
        q and k on their way to the cache."""
        dt = x1.dtype
        a1, a2 = x1.to(tl.float32), x2.to(tl.float32)
        o1 = (a1 * c).to(dt).to(tl.float32) + (-a2 * s).to(dt).to(tl.float32)
        o2 = (a2 * c).to(dt).to(tl.float32) + (a1 * s).to(dt).to(tl.float32)
        return o1.to(dt), o2.to(dt)

    @fast
    @triton.jit
    def _rope_kernel(qk_ptr, cos_ptr, sin_ptr, stride_t, stride_h, stride_c, heads,
                     HALF: tl.constexpr, HEADS_P2: tl.constexpr, HALF_P2: tl.constexpr,
                     PDL: tl.constexpr):
        # one program per token: every q and k head of the token, both halves at once
        pdl_wait(PDL)
        pdl_release(PDL)
        t = tl.program_id(0)
        h = tl.arange(0, HEADS_P2)[:, None]  # [HP, 1]
        d = tl.arange(0, HALF_P2)[None, :]  # [1, DP]
        mask = (h < heads) & (d < HALF)
        base = qk_ptr + t * stride_t + h * stride_h + d
        x1 = tl.load(base, mask=mask, other=0.0)
        x2 = tl.load(base + HALF, mask=mask, other=0.0)
        # cos/sin rows repeat their first half (HF layout): one half is enough
        c = tl.load(cos_ptr + t * stride_c + d, mask=d < HALF, other=0.0).to(tl.float32)
        s = tl.load(sin_ptr + t * stride_c + d, mask=d < HALF, other=0.0).to(tl.float32)
        o1, o2 = rotate_halves(x1, x2, c, s)
        tl.store(base, o1, mask=mask)
        tl.store(base + HALF, o2, mask=mask)

    @triton.jit
    def _silu_mul_values(gu_ptr, t, stride_g, inter, cols, mask):
        """silu(gate) * up at columns ``cols`` of token t, in the model dtype."""
        g = tl.load(gu_ptr + t * stride_g + cols, mask=mask, other=0.0)
        u = tl.load(gu_ptr + t * stride_g + inter + cols, mask=mask, other=0.0)
        gf = g.to(tl.float32)
        act = (gf / (1.0 + tl.exp(-gf))).to(g.dtype)  # F.silu rounds to the dtype
        return (act.to(tl.float32) * u.to(tl.float32)).to(g.dtype)

    @fast
    @triton.jit
    def _silu_mul_kernel(gu_ptr, out_ptr, stride_g, stride_o, inter,
                         BLOCK: tl.constexpr, PDL: tl.constexpr):
        # grid (token, column block)
        pdl_wait(PDL)
        pdl_release(PDL)
        t = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < inter
        y = _silu_mul_values(gu_ptr, t, stride_g, inter, cols, mask)
        tl.store(out_ptr + t * stride_o + cols, y, mask=mask)

    @fast
    @triton.jit
    def _silu_mul_fp8_kernel(gu_ptr, q_ptr, s_ptr, stride_g, stride_q, inter,
                             BLOCK: tl.constexpr, PDL: tl.constexpr):
        # one program per token, the whole row at once (its scale needs its largest value)
        pdl_wait(PDL)
        pdl_release(PDL)
        t = tl.program_id(0)
        cols = tl.arange(0, BLOCK)
        mask = cols < inter
        y = _silu_mul_values(gu_ptr, t, stride_g, inter, cols, mask)
        store_e4m3_row(q_ptr, s_ptr, t, stride_q, cols, mask, y.to(tl.float32))


def add_rms_norm_triton(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                        eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton twin of ``add_rms_norm_eager``: one kernel, one pass over the row."""
    out = torch.empty_like(x)
    return out, _launch_norm(x, residual, weight, out, out, eps, False)


def add_rms_norm_fp8(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``add_rms_norm_triton`` whose normed row goes out in fp8 for the next matmul:
    (codes [T, N] float8_e4m3fn, scales [T, 1] float32, the residual to carry), the bits
    ``fp8_matmul.quantize_rows`` gives for the model-dtype norm."""
    codes, scale = fp8_matmul.new_codes(*x.shape, x.device)
    res_out = _launch_norm(x, residual, weight, codes, scale, eps, True)
    return codes.view(fp8_matmul.FP8), scale, res_out


def _launch_norm(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                 out: torch.Tensor, scale: torch.Tensor, eps: float, fp8_out: bool
                 ) -> torch.Tensor:
    """One norm kernel into ``out`` (and ``scale`` with ``fp8_out``); returns the residual
    to carry: x + residual in a new tensor, or x itself without a residual."""
    T, N = x.shape
    res_out = torch.empty_like(x) if residual is not None else x
    res = residual if residual is not None else x
    block = triton.next_power_of_2(N)
    if T:
        _add_rms_norm_kernel[(T,)](x, res, weight, out, res_out, scale, x.stride(0),
                                   res.stride(0), out.stride(0), res_out.stride(0), N, eps,
                                   HAS_RES=residual is not None, FP8_OUT=fp8_out, BLOCK=block,
                                   **_norm_warps(block, x.device), **pdl.launch(x.device))
    return res_out


def _norm_warps(block: int, device: torch.device) -> dict:
    """About 512 columns a warp (4 to 16 warps): a row's loads, squares and sum spread
    over more threads shorten the kernel, which the next matmul waits for. On an H200 at
    4,096 columns: 1.44 us a call with 8 or 16 warps against 1.69 with 4 (64 rows; 1.26 vs
    1.52 at one row), docs/BENCHMARKS.md."""
    if device.type != "cuda":
        return {}  # the interpreter runs one program at a time
    return {"num_warps": min(16, max(4, block // 512))}


def rope_triton_(qk: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The Triton twin of ``rope_eager_`` (in place on the q|k heads of a qkv row)."""
    T, heads, hd = qk.shape
    assert qk.stride(2) == 1 and cos.stride(1) == 1 and cos.stride() == sin.stride()
    if T:
        _rope_kernel[(T,)](qk, cos, sin, qk.stride(0), qk.stride(1), cos.stride(0), heads,
                           HALF=hd // 2, HEADS_P2=triton.next_power_of_2(heads),
                           HALF_P2=triton.next_power_of_2(hd // 2), **pdl.launch(qk.device))


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """The Triton twin of ``silu_mul_eager``."""
    T, two_inter = gate_up.shape
    inter = two_inter // 2
    out = torch.empty(T, inter, device=gate_up.device, dtype=gate_up.dtype)
    block = min(1024, triton.next_power_of_2(inter))
    if T:
        _silu_mul_kernel[(T, triton.cdiv(inter, block))](
            gate_up, out, gate_up.stride(0), out.stride(0), inter, BLOCK=block,
            **pdl.launch(gate_up.device))
    return out


def silu_mul_fp8(gate_up: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``silu_mul_triton`` whose output goes out in fp8 for the next matmul: (codes [T, inter]
    float8_e4m3fn, scales [T, 1] float32)."""
    T, two_inter = gate_up.shape
    inter = two_inter // 2
    codes, scale = fp8_matmul.new_codes(T, inter, gate_up.device)
    block = triton.next_power_of_2(inter)
    if T:
        _silu_mul_fp8_kernel[(T,)](gate_up, codes, scale, gate_up.stride(0), codes.stride(0),
                                   inter, BLOCK=block, **_norm_warps(block, gate_up.device),
                                   **pdl.launch(gate_up.device))
    return codes.view(fp8_matmul.FP8), scale


@dataclass(frozen=True)
class StepOps:
    """The non-matmul, non-attention work of a layer, in one implementation.
    ``rope_in_kv_store``: where the attention backend can (Triton), RoPE is left to its
    KV-store kernel, which rotates q in place and k on its way into the cache: one launch
    per layer instead of two, and k is read once. ``fuse_one_token``: a one-token step
    runs the norms and SiLU·mul inside the matmuls that consume them
    (``backend.layers.gemv``), where the layer has such a kernel. ``few_token_matmul``: a
    step of 2..``skinny_gemm.MAX_M`` tokens runs the matmuls with a measured tile there
    through ``backend.layers.skinny_gemm`` instead of cuBLAS. ``dependent_launch``: the
    attention kernels launch with programmatic dependent launch (``backend.layers.pdl``;
    the step ops' own kernels and the matmul kernels always do): measured faster in the
    all-Triton step, while the eager ops' ablation rows ran slower with it in one run.
    ``add_rms_norm_fp8`` / ``silu_mul_fp8`` (None: not available): the norm and SiLU·mul
    ending in the fp8 codes an fp8 layer multiplies by, instead of a model-dtype row that
    the layer would quantise in another pass."""
    name: str
    add_rms_norm: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    rope_: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], None]
    silu_mul: Callable[[torch.Tensor], torch.Tensor]
    rope_in_kv_store: bool = False
    fuse_one_token: bool = False
    few_token_matmul: bool = False
    dependent_launch: bool = False
    add_rms_norm_fp8: Callable[..., tuple[torch.Tensor, ...]] | None = None
    silu_mul_fp8: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | None = None


EAGER = StepOps("eager", add_rms_norm_eager, rope_eager_, silu_mul_eager)
TRITON = StepOps("triton", add_rms_norm_triton, rope_triton_, silu_mul_triton,
                 rope_in_kv_store=True, fuse_one_token=True, few_token_matmul=True,
                 dependent_launch=True, add_rms_norm_fp8=add_rms_norm_fp8,
                 silu_mul_fp8=silu_mul_fp8) \
    if AVAILABLE else None
