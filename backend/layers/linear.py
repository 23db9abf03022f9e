"""Linear layers with dense or quantised weights (int8 per output row and int4 group-wise,
weight-only; fp8 e4m3 per output row with fp8 activations), and the choice of the matmul
that runs them.

A layer is built empty and filled block of rows by block of rows (``load_rows``), so fused
matrices (q|k|v, gate|up) load from their parts and a quantised model never exists as a full
float copy: a quantised layer keeps its codes in a staging buffer until every row is there,
then packs them into the kernel's layout and drops the buffer.

Kernels (``Linear.kernel`` names the one that runs):
  * dense: ``F.linear`` (oneDNN on CPU, cuBLAS on CUDA); fp16 weights under float32
    activations on an x86 CPU: fbgemm's packed fp16 kernel for few rows (``cpu_fp16``).
  * CPU int8: ``torch._weight_int8pack_mm``; CPU int4: ``torch._weight_int4pack_mm_for_cpu``
    over ``_convert_weight_to_int4pack_for_cpu``'s layout (both oneDNN/AVX-512 kernels that
    read the packed codes directly) for few tokens; from ``cpu_dequant.COPY_MIN_ROWS`` tokens
    on (larger batches, prefill) the dense matmul on a copy of the weight in the model dtype
    kept beside the codes where ``keep_prefill_dense`` built one (it fits the memory budget),
    else from ``cpu_dequant.DENSE_MIN_ROWS`` tokens on the weight dequantised per call into a
    scratch buffer (``cpu_dequant``).
  * CUDA int8/int4: Triton GEMV (one token) and dequantising GEMM (up to ``TRITON_MAX_M``
    tokens, split along K for skinny layers) from ``quant_kernels``, tile shapes per token
    count from its ``CONFIGS``; larger batches (prefill) dequantise to the model dtype and
    run cuBLAS, where the matmul is compute-bound and the extra weight pass is small. Where
    ``keep_prefill_dense`` built a dense copy, calls from ``GPU_COPY_MIN_ROWS`` rows on run
    cuBLAS (or the few-token kernel) on it, as a dense layer would.
  * fp8: ``fp8_matmul.scaled_matmul`` (activations quantised per token, ``torch._scaled_mm``
    on the tensor cores at twice bf16's rate: prefill) at every token count; one token with
    the step ops' fusion runs the GEMV of ``gemv`` over the e4m3 codes instead (weight-only,
    its prologue fused; the activations stay in the model dtype).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn

from backend.layers import (cpu_aot, cpu_dequant, cpu_fp16, cpu_int8_rows, cpu_w4a8,
                            fp8_matmul, gemv, gpu_dequant, quant_kernels, skinny_gemm)
from backend.layers.fused_ops import StepOps
from backend.layers.gemv import NONE, SILU_MUL, Prologue
from backend.layers.quantize import (GroupQuantized, check_group, dequantize_fp8, dequantize_int8,
                                     quantize_fp8, quantize_int4, quantize_int8)

WEIGHT_DTYPES = ("auto", "bf16", "fp16", "fp32", "int8", "int4", "fp8")
LM_HEAD_DTYPES = ("model", "int8", "int4")
DENSE_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
TRITON_MAX_M = 128  # tokens per step up to which the Triton kernels run on CUDA
# On CUDA, from how many rows a kept dense copy (``keep_prefill_dense``) replaces the codes
# unless set or timed at start (``--gpu-copy-min-rows``, ``copy_rows.choose``): past the 64-row
# tiles. Llama-2-7B, decode steps at 512-token contexts (H100, 2026-12-05, docs/BENCHMARKS.md
# "Dense copies of quantised layers on CUDA"): at batch 64 the int4 codes took 11.5 ms, the
# copies 12.2-12.6, bf16 12.9-13.1 (on an H200 int4 was 1.3-2 % slower than bf16 there); at
# batch 128 the copies 19.2 ms, the int4 codes 21.1-21.3, int8's 20.7, bf16 19.5-20.3.
GPU_COPY_MIN_ROWS = {"int4": 65, "int8": 65}
PREFILL_DENSE_MODES = ("auto", "on", "off")
ONE_ROW_AOT_KERNEL = cpu_aot.OneRowInt8.name  # ``Int8Linear.one_row``'s name in /health


@dataclass(frozen=True)
class WeightFormat:
    """How a linear layer stores its weight: ``kind`` dense (in ``dtype``, None = the model
    dtype), int8 (per output row), int4 (``group_size`` inputs per scale/min pair) or fp8
    (e4m3, per output row)."""
    kind: str = "dense"
    dtype: torch.dtype | None = None
    group_size: int = 32

    def __post_init__(self) -> None:
        if self.kind not in ("dense", "int8", "int4", "fp8"):
            raise ValueError(f"unknown weight format {self.kind!r}")
        if self.kind == "int4" and self.group_size < 1:
            raise ValueError(f"int4 group size must be >= 1, got {self.group_size}")

    @classmethod
    def parse(cls, name: str, group_size: int = 32) -> "WeightFormat":
        """``bf16|fp16|fp32|int8|int4|fp8`` (``auto`` is resolved by the caller first)."""
        if name in DENSE_DTYPES:
            return cls("dense", DENSE_DTYPES[name])
        if name in ("int8", "int4", "fp8"):
            return cls(name, None, group_size)
        raise ValueError(f"weight dtype must be one of {', '.join(WEIGHT_DTYPES[1:])}; "
                         f"got {name!r}")

    def describe(self, model_dtype: torch.dtype) -> str:
        if self.kind == "dense":
            dtype = self.dtype or model_dtype
            return {v: k for k, v in DENSE_DTYPES.items()}[dtype]
        return f"int4-g{self.group_size}" if self.kind == "int4" else self.kind


# Inputs per block of a file's int4 codes: GGUF Q4_0 / Q4_1, backend.weights.gguf_quant.BLOCK
# (the loaders build on the layers, not the other way round).
FILE_INT4_GROUP = 32


def resolve_weight_format(name: str, group_size: int, native: str | None,
                          keep_codes: bool = True,
                          dense: WeightFormat = WeightFormat()) -> WeightFormat:
    """``--weights-dtype`` -> a format. auto: the file's own code form when it has one we
    run (``native`` "int4"/"int8") and its kernels are fast on this device
    (``keep_codes``), else ``dense`` (the caller's choice of float weights: the model
    dtype, or fp16 where fbgemm runs it faster, see ``ModelRunner``)."""
    if name == "auto":
        if not keep_codes:
            return dense
        if native == "int4":
            return WeightFormat("int4", None, FILE_INT4_GROUP)
        return WeightFormat("int8") if native == "int8" else dense
    return WeightFormat.parse(name, group_size)


def keeps_file_codes(fmt: WeightFormat, native: str | None) -> bool:
    """Whether layers of ``fmt`` keep a file's codes as they are (their groups are the
    file's blocks) instead of rounding its values again."""
    return fmt.kind == "int4" and native == "int4" and fmt.group_size == FILE_INT4_GROUP


def make_linear(fmt: WeightFormat, out_features: int, in_features: int, bias: bool,
                device: torch.device, dtype: torch.dtype) -> "Linear":
    """An empty layer in ``fmt``; ``dtype`` is the model (activation) dtype."""
    if fmt.kind == "int8":
        return Int8Linear(out_features, in_features, bias, device, dtype)
    if fmt.kind == "int4":
        return Int4Linear(out_features, in_features, bias, device, dtype, fmt.group_size)
    if fmt.kind == "fp8":
        return Fp8Linear(out_features, in_features, bias, device, dtype)
    return DenseLinear(out_features, in_features, bias, device, dtype, fmt.dtype or dtype)


@dataclass(frozen=True)
class PrefillDense:
    """What ``keep_prefill_dense`` decided for a model's layers (``/health``)."""
    mode: str  # auto | on | off, as asked
    enabled: bool  # the layers multiply by kept copies
    layers: int  # layers holding a copy
    bytes: int  # memory the copies hold
    needed_bytes: int  # what copies of every layer that can use one take (or would)
    max_bytes: int | None  # auto's budget; None for on / off
    reason: str

    def as_dict(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def keep_prefill_dense(layers: Iterable[Linear], mode: str, max_bytes: int
                       ) -> PrefillDense:
    """Give every quantised layer in ``layers`` a dense copy of its weight for calls of
    many rows (``cpu_dequant.COPY_MIN_ROWS`` on the CPU, ``GPU_COPY_MIN_ROWS`` on CUDA), and
    every bf16 dense CPU layer a copy reordered for oneDNN for all its calls, or drop the
    copies: ``on`` keeps them, ``off`` drops them, ``auto`` keeps them when all of them
    together take at most ``max_bytes``. All or none: a model half on copies would still pay
    the per-call pass (or reorder) in every other layer of each step."""
    if mode not in PREFILL_DENSE_MODES:
        raise ValueError(f"prefill dense weights must be one of "
                         f"{', '.join(PREFILL_DENSE_MODES)}; got {mode!r}")
    quantised = [m for m in layers if isinstance(m, (_QuantizedLinear, DenseLinear))]
    needed = sum(m.prefill_dense_bytes() for m in quantised)
    budget = max_bytes if mode == "auto" else None
    if needed == 0:
        keep, reason = False, "no linear layer that a copy would serve"
    elif mode == "auto":
        keep = needed <= max_bytes
        reason = (f"auto: {needed / 2**20:.1f} MiB "
                  f"{'within' if keep else 'over'} the {max_bytes / 2**20:.1f} MiB budget")
    else:
        keep, reason = mode == "on", mode
    held = [m.keep_prefill_dense(keep) for m in quantised]
    return PrefillDense(mode, keep, sum(1 for b in held if b), sum(held), needed, budget,
                        reason)


def kept_copies(layers: Iterable[nn.Module]) -> list[_QuantizedLinear]:
    """The quantised layers among ``layers`` that hold a dense copy of their weight."""
    return [m for m in layers
            if isinstance(m, _QuantizedLinear) and m.prefill_weight is not None]


def frozen(t: torch.Tensor) -> nn.Parameter:
    """An inference-only parameter: in ``named_parameters``/``state_dict``, moved by ``.to``."""
    return nn.Parameter(t, requires_grad=False)


class Linear(nn.Module):
    """y = x @ W.T (+ b) for x [T, in_features] in the model dtype. Float weights are
    parameters, quantised codes and scales buffers (registered once packed), so
    ``state_dict``, ``named_parameters``/``named_buffers`` and ``.to`` see them all."""
    kernel = "none"
    # Counts the times any layer's packed tensors were built or replaced (load, ``.to``):
    # callables that hold them (``few_rows_fn``) are stale once it moves.
    generation = 0

    def __init__(self, out_features: int, in_features: int, bias: bool,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        self.out_features, self.in_features = out_features, in_features
        self.device, self.dtype = device, dtype
        self.bias = frozen(torch.zeros(out_features, device=device, dtype=dtype)) \
            if bias else None

    @property
    def weight_shape(self) -> tuple[int, int]:
        return self.out_features, self.in_features

    def load_rows(self, rows: slice, value: torch.Tensor | GroupQuantized) -> None:
        """Fill weight rows ``rows`` from float values [n, K] or file codes."""
        raise NotImplementedError

    def dequantized(self) -> torch.Tensor:
        """The weight the kernel really multiplies by, [N, K] float32 (test reference)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def few_rows_fn(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], str | None]:
        """(fn, kind): ``fn(x)`` is ``forward(x)`` for x of fewer rows than
        ``cpu_dequant.few_rows_limit(kind)`` (for a layer on the module's copy thresholds,
        as the blocks' are; the LM head has its own), with the kernel and its tensors bound
        once (a decode step's flat loop skips ``forward``'s per-call choice: ~3 us a call on
        a 2-core CPU); kind None: fn is ``forward`` or gives its bits, for any rows. Valid
        until ``Linear.generation`` moves."""
        return self.forward, None

    def one_token(self, x: torch.Tensor, prologue: Prologue
                  ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """One token with ``prologue`` fused into the matmul's kernel: (y [1, N], the
        residual to carry), or None where this layer has no such kernel."""
        return None

    def one_token_kernel(self, fused: bool) -> str:
        """The kernel a one-token step runs (``fused``: the step ops fuse where they can)."""
        return self.kernel

    def prefill_kernel(self) -> str:
        """The kernel a call with many rows (a long prompt's prefill) runs."""
        return self.kernel

    def few_tokens(self, x: torch.Tensor) -> torch.Tensor | None:
        """x [M, K] for 2..``skinny_gemm.MAX_M`` tokens through the few-token kernel, or
        None where this layer has no tile for M (then ``forward`` runs)."""
        return None

    def after_prologue(self, x: torch.Tensor, prologue: Prologue, ops: StepOps
                       ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """The layer's input made by the step ops' own form of ``prologue`` for it, then
        the matmul: (y, the residual to carry), or None where the layer and ops have none
        (then the prologue runs as usual and ``forward`` after it)."""
        return None

    def adds_residual(self, x: torch.Tensor) -> bool:
        """Whether ``one_token_added`` serves a one-token call whose input is x (before its
        prologue: only x's rows and device matter)."""
        return False

    def one_token_added(self, x: torch.Tensor, residual: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """One token: (x @ W.T + residual, the sums of squares of that sum by part, for the
        next RMSNorm); only where ``adds_residual``."""
        raise NotImplementedError

    def one_token_normed(self, x: torch.Tensor, prologue: Prologue) -> torch.Tensor | None:
        """One token through a NORM ``prologue`` that carries x's sums of squares
        (``Prologue.ss``), the norm finished inside this layer's kernel; None where the
        layer has no such kernel."""
        return None

    def _add_bias(self, y: torch.Tensor) -> torch.Tensor:
        return y if self.bias is None else y + self.bias


def matmul(linear: Linear, x: torch.Tensor, prologue: Prologue, ops: StepOps
           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """linear(prologue(x)) and the residual to carry (None unless the prologue is a norm).
    At one token, where the step ops allow it and the layer has a kernel for it, one launch
    (``gemv``); otherwise the ops' own kernels, then the layer (fp8 layers take the ops'
    output already in fp8 where the ops make it; at a few tokens through ``skinny_gemm``
    where the ops allow it and the layer has a tile for the shape)."""
    M = x.shape[0]
    if ops.fuse_one_token and M == 1:
        if prologue.ss is not None and (y := linear.one_token_normed(x, prologue)) is not None:
            return y, x  # x is the residual stream already (NORM)
        fused = linear.one_token(x, prologue)
        if fused is not None:
            return fused
    fused = linear.after_prologue(x, prologue, ops)
    if fused is not None:
        return fused
    residual = None
    if prologue.kind == SILU_MUL:
        x = ops.silu_mul(x)
    elif prologue.normed:
        x, residual = ops.add_rms_norm(x, prologue.residual, prologue.norm_w, prologue.eps)
    y = linear.few_tokens(x) if ops.few_token_matmul and 1 < M <= skinny_gemm.MAX_M else None
    return (linear(x) if y is None else y), residual


def matmul_into_stream(linear: Linear, x: torch.Tensor, prologue: Prologue,
                       residual: torch.Tensor | None, ops: StepOps
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(linear(prologue(x)), None), the residual left for the next norm to add; or, where one
    kernel at one token adds it too (``Linear.adds_residual``): (linear(prologue(x)) +
    residual, the sum's sums of squares by part), which a NORM prologue with ``ss`` takes
    over as the stream: the add + RMSNorm kernel between the two layers does not run."""
    if (ops.fuse_one_token and residual is not None and x.shape[0] == 1
            and prologue.kind in (NONE, SILU_MUL) and linear.adds_residual(x)):
        a = ops.silu_mul(x) if prologue.kind == SILU_MUL else x
        return linear.one_token_added(a, residual)
    return matmul(linear, x, prologue, ops)[0], None


def _few_tokens_dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None
                      ) -> torch.Tensor | None:
    """x [M, K] @ weight [N, K].T (+ bias) through the few-token kernel, or None where it has
    no tile for the shape (``DenseLinear.few_tokens``, and a quantised layer's kept copy)."""
    if not skinny_gemm.runs(x, weight):
        return None
    return skinny_gemm.skinny_gemm(x.contiguous(), weight, bias)


class LinearRows:
    """A block of rows of a layer's weight (all of them by default): a load destination."""

    def __init__(self, linear: Linear, rows: slice = slice(None)) -> None:
        self.linear, self.rows = linear, rows

    @property
    def shape(self) -> tuple[int, int]:
        n = len(range(*self.rows.indices(self.linear.out_features)))
        return n, self.linear.in_features

    def load(self, value: torch.Tensor | GroupQuantized) -> None:
        self.linear.load_rows(self.rows, value)


class DenseLinear(Linear):
    """Weights in a float dtype. fp16 weights under float32 activations on an x86 CPU run
    their few-row calls through fbgemm's packed fp16 kernel (``cpu_fp16``; the packed copy
    is built by ``pack``, which the engine calls once the model is loaded, or else at the
    first such call after loading) and their many-row calls through the dense matmul on
    the weight widened to float32."""
    kernel = "dense"

    def __init__(self, out_features: int, in_features: int, bias: bool,
                 device: torch.device, dtype: torch.dtype, weight_dtype: torch.dtype) -> None:
        super().__init__(out_features, in_features, bias, device, dtype)
        self.weight = frozen(torch.empty(out_features, in_features, device=device,
                                         dtype=weight_dtype))
        self.fp16_packed = cpu_fp16.runs(weight_dtype, dtype, device)
        self._packed: torch.ScriptObject | None = None  # fbgemm's copy, derived: no state
        if self.fp16_packed:
            self.kernel = "fbgemm-fp16"
        # A bf16 weight on the CPU reordered once for oneDNN (``keep_prefill_dense``), which
        # every call then multiplies by; derived, so no state. A plain bf16 weight is
        # reordered inside each call: SmolLM2 in bf16 decoded at batch 1 in 22 ms a step
        # with the copies against 36 ms without (2-core AVX-512 VM, docs/BENCHMARKS.md).
        self._onednn: torch.Tensor | None = None

    @classmethod
    def over(cls, weight: torch.Tensor) -> "DenseLinear":
        """A layer that uses ``weight`` [N, K] itself (a tied LM head shares the embedding)."""
        layer = cls(0, weight.shape[1], False, weight.device, weight.dtype, weight.dtype)
        layer.out_features = weight.shape[0]
        layer.weight = weight if isinstance(weight, nn.Parameter) else frozen(weight)
        return layer

    def load_rows(self, rows: slice, value: torch.Tensor | GroupQuantized) -> None:
        if isinstance(value, GroupQuantized):
            value = value.dequantize()
        self.weight[rows].copy_(value)
        self._packed = None  # packed again from the new values at the next call
        if self._onednn is not None:  # a reload: the copy follows the new values
            self._onednn = cpu_dequant.onednn_weight(self.weight.detach())

    def prefill_dense_bytes(self) -> int:
        """Bytes of a copy of the weight reordered for oneDNN; 0 where none would be used
        (not a bf16 layer on the CPU, or no oneDNN bf16 here)."""
        w = self.weight
        if (self.fp16_packed or w.device.type != "cpu" or w.dtype != torch.bfloat16
                or self.dtype != torch.bfloat16 or not cpu_dequant.onednn_bf16()):
            return 0
        return w.numel() * w.element_size()

    def keep_prefill_dense(self, keep: bool) -> int:
        """Build (``keep``) or drop the reordered copy; returns the bytes it holds. A tied
        head's copy is of the embedding's weight as it is now."""
        keep = keep and self.prefill_dense_bytes() > 0
        if keep and self._onednn is None:
            self._onednn = cpu_dequant.onednn_weight(self.weight.detach())
        elif not keep:
            self._onednn = None
        self.kernel = "dense-onednn" if self._onednn is not None else \
            type(self).kernel if not self.fp16_packed else "fbgemm-fp16"
        return 0 if self._onednn is None else self.prefill_dense_bytes()

    def _apply(self, fn, recurse: bool = True):
        out = super()._apply(fn, recurse)
        if self._onednn is not None:  # moved or converted: reordered again where it can be
            self.keep_prefill_dense(False)
            self.keep_prefill_dense(True)
        Linear.generation += 1  # ``few_rows_fn``'s view of the old weight is stale
        return out

    def few_rows_fn(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], str | None]:
        w = self.weight
        if w.device.type != "cuda" or self.bias is not None or w.dtype != self.dtype:
            return super().few_rows_fn()
        # For a 2-D x without a bias F.linear(x, w) is mm(x, w.t()): the same cuBLAS call
        # and bits, without the dispatch of linear, t and matmul around it. Outside CUDA
        # graphs the host launches every kernel of a step and is its bottleneck at small
        # batches (docs/BENCHMARKS.md, "The eager step's host cost").
        wt = w.t()
        return (lambda x: torch.mm(x, wt)), None

    def dequantized(self) -> torch.Tensor:
        return self.weight.float()

    def prefill_kernel(self) -> str:
        return "widen+F.linear" if self.fp16_packed else self.kernel

    def pack(self) -> bool:
        """Builds fbgemm's packed copy now if this layer runs through it and has none;
        whether it did. Otherwise the first few-row call after loading builds it."""
        if not self.fp16_packed or self._packed is not None:
            return False
        self._packed = cpu_fp16.pack(self.weight)
        return True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (self._onednn is not None and x.dtype == torch.bfloat16
                and not torch.compiler.is_compiling()):  # compiled: no opaque layouts
            return self._add_bias(cpu_dequant.onednn_linear(x, self._onednn))
        if self.fp16_packed:
            if x.shape[0] < cpu_fp16.DENSE_MIN_ROWS:
                self.pack()
                return self._add_bias(cpu_fp16.matmul(x, self._packed))
            return self._add_bias(cpu_dequant.widened_matmul(x, w))
        if w.dtype == x.dtype:
            if (x.shape[0] == 1 and w.dtype == torch.bfloat16 and self.bias is None
                    and x.device.type == "cpu"):
                # One bf16 row on the CPU: torch.mv's GEMV read the weight about 1.5x faster
                # than F.linear's, with the same bits, on an AVX-512 Xeon VM (SmolLM2's tied
                # LM head: 1.6 against 2.5 ms)
                return torch.mv(w, x[0]).unsqueeze(0)
            return F.linear(x, w, self.bias)
        # Weights stored in another dtype than the activations (--weights-dtype fp32 under
        # a bf16 model, ...): the matmul runs in the weights' dtype.
        return self._add_bias(F.linear(x.to(w.dtype), w).to(x.dtype))

    def one_token(self, x: torch.Tensor, prologue: Prologue
                  ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if not self._gemv_runs(x.dtype, x.device):
            return None
        return gemv.gemv(x.contiguous(), self.weight, self.bias, prologue)

    def one_token_kernel(self, fused: bool) -> str:
        return "triton-gemv" if fused and self._gemv_runs(self.dtype, self.device) \
            else self.kernel

    def few_tokens(self, x: torch.Tensor) -> torch.Tensor | None:
        return _few_tokens_dense(x, self.weight, self.bias)

    def _gemv_runs(self, dtype: torch.dtype, device: torch.device) -> bool:
        return self.weight.dtype == dtype and gemv.runs_on(device)


class _QuantizedLinear(Linear):
    """Codes wait in a staging buffer until every row is loaded, then ``_pack`` builds the
    kernel's layout and the buffer goes."""

    def __init__(self, out_features: int, in_features: int, bias: bool,
                 device: torch.device, dtype: torch.dtype) -> None:
        super().__init__(out_features, in_features, bias, device, dtype)
        self._filled = torch.zeros(out_features, dtype=torch.bool)
        self._stage: dict[str, torch.Tensor] | None = None
        self.kernel = "unloaded"
        # The dense copy for many-row calls (``keep_prefill_dense``), None without one: a
        # buffer so ``.to`` moves it, not persistent since it is derived from the codes. On
        # the CPU in ``_dense_for_prefill``'s layout (reordered for oneDNN where it can be),
        # on CUDA the whole weight W [N, K] in the model dtype (``_gpu_dense``).
        self.prefill_weight: torch.Tensor | None
        self.register_buffer("prefill_weight", None, persistent=False)
        # from how many rows a kept copy is used: the block layers' crossover by default; the
        # model gives its LM head the head's (``cpu_dequant.HEAD_COPY_MIN_ROWS``)
        self.copy_min_rows = cpu_dequant.COPY_MIN_ROWS
        # on CUDA from how many rows: the fixed crossover unless ``copy_rows.choose`` sets it
        # (--gpu-copy-min-rows N, or timed at start with auto)
        self.gpu_copy_min_rows = GPU_COPY_MIN_ROWS.get(self.copy_kind, TRITON_MAX_M + 1)

    def load_rows(self, rows: slice, value: torch.Tensor | GroupQuantized) -> None:
        n = len(range(*rows.indices(self.out_features)))
        if tuple(value.shape) != (n, self.in_features):
            raise ValueError(f"rows {rows}: got {tuple(value.shape)}, "
                             f"expected {(n, self.in_features)}")
        if self._stage is None:
            self._stage = self._new_stage()
        for key, part in self._codes(value).items():
            self._stage[key][rows].copy_(part)
        self._filled[rows] = True
        if bool(self._filled.all()):
            self._pack(self._stage)
            Linear.generation += 1
            self._stage = None
            self._filled.zero_()  # a later full reload (a shared init, tests) starts over
            if self.prefill_weight is not None:  # a reload: the copy follows the new codes
                self.prefill_weight = self._build_copy()

    def prefill_dense_bytes(self) -> int:
        """Bytes a dense prefill copy of this layer takes in the model dtype; 0 where none
        would be used (not loaded, or a layout the CPU path cannot read)."""
        if not self._dense_copy_possible():
            return 0
        return self.out_features * self.in_features * self.dtype.itemsize

    def keep_prefill_dense(self, keep: bool) -> int:
        """Build (``keep``) or drop the dense prefill copy; returns the bytes it holds."""
        keep = keep and self.prefill_dense_bytes() > 0
        if keep and self.prefill_weight is None:
            self.prefill_weight = self._build_copy()
        elif not keep:
            self.prefill_weight = None
        return 0 if self.prefill_weight is None else \
            self.prefill_weight.numel() * self.prefill_weight.element_size()

    def prefill_kernel(self) -> str:
        if self.device.type == "cuda":  # beyond TRITON_MAX_M tokens: cuBLAS
            return "dequant+F.linear" if self.prefill_weight is None else "dense-copy+F.linear"
        if self.prefill_weight is not None:
            return "dense-copy+onednn" if self.prefill_weight.is_mkldnn \
                else "dense-copy+F.linear"
        return "cpu-dequant+F.linear" if self._dense_copy_possible() else self.kernel

    def _dense_copy_possible(self) -> bool:
        return self._packed_on_cpu() or (self.device.type == "cuda" and self.kernel != "unloaded")

    copy_kind = "none"  # ``GPU_COPY_MIN_ROWS``' key

    def _gpu_copy(self, x: torch.Tensor) -> torch.Tensor | None:
        """The kept copy where this call multiplies by it on CUDA (enough rows, the
        activations' dtype), else None."""
        w = self.prefill_weight
        if (w is None or self.device.type != "cuda" or w.dtype != x.dtype
                or x.shape[0] < self.gpu_copy_min_rows):
            return None
        return w

    def few_tokens(self, x: torch.Tensor) -> torch.Tensor | None:
        # a CUDA step of many rows on the kept copy, as the dense layer's step would run
        w = self._gpu_copy(x)
        return None if w is None else _few_tokens_dense(x, w, self.bias)

    def _gpu_dense(self) -> torch.Tensor:
        """The weight W [N, K] in the model dtype, dequantised on the GPU."""
        raise NotImplementedError

    def _through_copy(self, x: torch.Tensor, kind: str) -> bool:
        """Whether this CPU call multiplies by the kept dense copy: enough rows
        (``copy_min_rows``), a copy in the activations' dtype, and not inside torch.compile
        (``--compile``), whose traced code cannot read oneDNN's opaque layout: the codes
        serve compiled calls."""
        w = self.prefill_weight
        if w is None or w.dtype != x.dtype or torch.compiler.is_compiling():
            return False
        return x.shape[0] >= self.copy_min_rows[kind if w.is_mkldnn else f"{kind}-plain"]

    def copy_matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x: [T, K] -> [T, N] through the kept dense copy (no bias)."""
        raise NotImplementedError

    # Whether ``_dense_for_prefill`` gives W [N, K] (else W.T [K, N], ``x @ w``'s operand).
    copy_is_nk = True

    def _dense_for_prefill(self) -> torch.Tensor:
        """The dense copy, from the packed codes, with the per-call path's own arithmetic."""
        raise NotImplementedError

    def _build_copy(self) -> torch.Tensor:
        """The kept copy: on CUDA the weight itself; on the CPU in bf16 reordered once for
        oneDNN (``cpu_dequant.onednn_weight``), else as ``_dense_for_prefill`` gives it."""
        if self.device.type == "cuda":
            return self._gpu_dense()
        return self._reordered(self._dense_for_prefill())

    def _reordered(self, w: torch.Tensor) -> torch.Tensor:
        """w in ``_dense_for_prefill``'s layout, reordered for oneDNN where it can be."""
        packed = cpu_dequant.onednn_weight(w if self.copy_is_nk else w.t())
        return w if packed is None else packed

    def _copy_mm(self, x: torch.Tensor) -> torch.Tensor:
        """x [T, K] @ W.T through the kept copy, in whichever form it is kept."""
        w = self.prefill_weight
        if w.is_mkldnn:
            return cpu_dequant.onednn_linear(x, w)
        return F.linear(x, w) if self.copy_is_nk else x @ w

    def _apply(self, fn, recurse: bool = True):
        # oneDNN's layout has no strides for ``.to`` / ``.float`` to convert: the copy goes
        # through its plain form and is reordered again if it is still bf16 on the CPU.
        w = self.prefill_weight
        if w is not None and w.is_mkldnn:
            dense = w.to_dense()
            self.prefill_weight = dense if self.copy_is_nk else dense.t().contiguous()
        out = super()._apply(fn, recurse)
        if self.prefill_weight is not None:
            self.prefill_weight = self._reordered(self.prefill_weight)
        Linear.generation += 1
        return out

    def _packed_on_cpu(self) -> bool:
        return self.device.type == "cpu" and self.kernel != "unloaded"

    def _with_bias(self, mm: Callable[[torch.Tensor], torch.Tensor], kind: str
                   ) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
        """``few_rows_fn`` of a CPU layer whose packed kernel (bias left out) is ``mm``."""
        bias = self.bias
        return (mm if bias is None else lambda x: mm(x) + bias), kind

    def _new_stage(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _codes(self, value: torch.Tensor | GroupQuantized) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def _pack(self, stage: dict[str, torch.Tensor]) -> None:
        raise NotImplementedError


class Int8Linear(_QuantizedLinear):
    """Symmetric int8, one scale per output row: W = q * scale[:, None]."""
    # On the CPU, one-row calls through a GEMV compiled ahead of time for this shape, or
    # calls of every row count through ``cpu_int8_rows`` where torch's int8 kernel is
    # unvectorised, where the engine loaded one (``backend.engine.aot_kernels``: the LM
    # head's)
    one_row: cpu_aot.OneRowInt8 | cpu_int8_rows.Int8Rows | None = None

    def _new_stage(self) -> dict[str, torch.Tensor]:
        N, K, dev = self.out_features, self.in_features, self.device
        return {"q": torch.empty(N, K, dtype=torch.int8, device=dev),
                "scale": torch.empty(N, dtype=torch.float32, device=dev)}

    def _codes(self, value: torch.Tensor | GroupQuantized) -> dict[str, torch.Tensor]:
        if isinstance(value, GroupQuantized):
            value = value.dequantize()  # GGUF Q8_0 has a scale per 32 inputs: re-quantise
        q, scale = quantize_int8(value.to(self.device), self.dtype)
        return {"q": q, "scale": scale}

    def _pack(self, stage: dict[str, torch.Tensor]) -> None:
        self.register_buffer("q", stage["q"].contiguous())  # [N, K] int8
        self.register_buffer("scale", stage["scale"].to(self.dtype))  # [N]
        if self.device.type == "cpu":
            self.kernel = "torch._weight_int8pack_mm"
        elif quant_kernels.AVAILABLE:
            self.kernel = "triton-int8"
        else:
            self.kernel = "dequant+F.linear"

    def dequantized(self) -> torch.Tensor:
        return dequantize_int8(self.q, self.scale)

    copy_kind = "int8"

    def _dense_for_prefill(self) -> torch.Tensor:
        return cpu_dequant.int8_dense(self.q, self.dtype)  # [N, K]; the scale stays apart

    def _gpu_dense(self) -> torch.Tensor:
        return gpu_dequant.int8_dense(self.q, self.scale, self.dtype)

    def copy_matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self._copy_mm(x) * self.scale  # int8_matmul minus its conversion

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, K]
        if self.device.type == "cpu":
            if (one_row := self.one_row) is not None and one_row.accepts(x):
                y = one_row(x, self.q, self.scale)
            elif self._through_copy(x, "int8"):
                y = self.copy_matmul(x)
            elif x.shape[0] < cpu_dequant.DENSE_MIN_ROWS["int8"]:
                y = torch._weight_int8pack_mm(x, self.q, self.scale)
            else:
                y = cpu_dequant.int8_matmul(x, self.q, self.scale)
        elif (w := self._gpu_copy(x)) is not None:
            return F.linear(x, w, self.bias)
        elif quant_kernels.AVAILABLE and x.shape[0] <= TRITON_MAX_M:
            y = quant_kernels.int8_matmul(x, self.q, self.scale)
        else:
            y = F.linear(x, gpu_dequant.int8_dense(self.q, self.scale, x.dtype))
        return self._add_bias(y)  # [T, N]

    def few_rows_fn(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], str | None]:
        if not self._packed_on_cpu():
            return super().few_rows_fn()
        q, scale = self.q, self.scale
        return self._with_bias(lambda x: torch._weight_int8pack_mm(x, q, scale), "int8")

    def one_token(self, x: torch.Tensor, prologue: Prologue
                  ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if self.device.type != "cuda" or not quant_kernels.AVAILABLE:
            return None  # the CPU runs torch's packed kernels
        fused = quant_kernels.int8_gemv_fused(x.contiguous(), self.q, self.scale, prologue)
        return None if fused is None else (self._add_bias(fused[0]), fused[1])

    def one_token_kernel(self, fused: bool) -> str:
        if fused and self.device.type == "cuda" and self.weight_shape in quant_kernels.INT8_FUSED:
            return "triton-int8-fused"
        if self.one_row is not None and self.device.type == "cpu":
            return self.one_row.name
        return self.kernel

    def prefill_dense_bytes(self) -> int:
        # a kernel for every row count (``cpu_int8_rows``) leaves a dense copy no call
        if self.one_row is not None and self.one_row.max_rows is None:
            return 0
        return super().prefill_dense_bytes()


class Int4Linear(_QuantizedLinear):
    """Asymmetric group-wise int4: W[n, k] = q * scale[n, k // G] + min[n, k // G]."""

    def __init__(self, out_features: int, in_features: int, bias: bool,
                 device: torch.device, dtype: torch.dtype, group_size: int) -> None:
        check_group(in_features, group_size)
        if device.type == "cuda" and (in_features // 2) % group_size:
            raise ValueError(f"int4 on CUDA needs the group size {group_size} to divide half "
                             f"the input width {in_features}")
        super().__init__(out_features, in_features, bias, device, dtype)
        self.group_size = group_size

    def _new_stage(self) -> dict[str, torch.Tensor]:
        N, K, G, dev = self.out_features, self.in_features, self.group_size, self.device
        return {"codes": torch.empty(N, K, dtype=torch.uint8, device=dev),
                "scale": torch.empty(N, K // G, dtype=torch.float32, device=dev),
                "min": torch.empty(N, K // G, dtype=torch.float32, device=dev)}

    def _codes(self, value: torch.Tensor | GroupQuantized) -> dict[str, torch.Tensor]:
        if not (isinstance(value, GroupQuantized) and value.bits == 4
                and value.group_size == self.group_size):
            # Kept as they are only when the file's groups are ours (GGUF Q4_0/Q4_1 with
            # G = 32); anything else is quantised from its values.
            dense = value.dequantize() if isinstance(value, GroupQuantized) else value
            value = quantize_int4(dense.to(self.device), self.group_size)
        return {"codes": value.codes, "scale": value.scale, "min": value.min}

    # On the CPU, calls of few rows through the int4 x int8 op (``cpu_w4a8``), where the
    # engine attached it (``attach_w4a8``): its codes and scales, packed beside torch's,
    # with the activations in ``w4a8_parts`` int8 parts per block
    w4a8 = False
    w4a8_parts = 1
    # Whether torch's packing (``packed``, ``scale_zero``) is kept on the CPU: a layer whose
    # every call the op and the dense paths serve drops it (``release_torch_packing``)
    torch_packed = True

    def _pack(self, stage: dict[str, torch.Tensor]) -> None:
        codes, scale, lo = stage["codes"], stage["scale"], stage["min"]
        if self.device.type == "cpu":
            if self.torch_packed:
                self._pack_torch(codes, scale, lo)
            if self.w4a8:  # a reload: the op's copy follows the new codes
                self._pack_w4a8(codes, scale, lo)
        else:
            self.register_buffer("packed", quant_kernels.pack_int4(codes))  # [N, K / 2] uint8
            self.register_buffer("scale_min", quant_kernels.pack_scale_min(  # [N, K / 2G, 4]
                scale.to(self.dtype), lo.to(self.dtype)))
            # The Triton kernels tile one group as a power-of-two block of >= 16 bytes.
            self.triton = quant_kernels.AVAILABLE and quant_kernels.int4_supported(
                self.in_features, self.group_size)
            self.kernel = "triton-int4" if self.triton else "dequant+F.linear"

    def _pack_torch(self, codes: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> None:
        # tinygemm's convention: W = (q - 8) * scale + zero, so zero = min + 8 * scale.
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            codes.to(torch.int32), 1))
        self.register_buffer("scale_zero", (  # [N, K/G, 2] -> [K/G, N, 2]
            torch.stack([scale, lo + 8 * scale], dim=-1)
            .transpose(0, 1).contiguous().to(self.dtype)))
        # Many-token calls dequantise from the packed bytes, if we read their layout.
        self.dense_from_packed = cpu_dequant.int4_layout_ok(self.packed, codes)
        self.kernel = "torch._weight_int4pack_mm_for_cpu"
        self.torch_packed = True

    def _pack_w4a8(self, codes: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor) -> None:
        tiles, scale_min = cpu_w4a8.pack(codes, scale, lo, self.group_size)
        self.register_buffer("w4a8_codes", tiles)  # [N/16, K/8, 64] uint8
        # fp16 bits held as int16, so that ``.to(dtype)`` leaves them as they are
        self.register_buffer("w4a8_scale_min", scale_min.view(torch.int16))
        self.w4a8 = True
        self.kernel = f"{cpu_w4a8.KERNEL_NAME}x{self.w4a8_parts}"

    def w4a8_serves(self) -> bool:
        """Whether this layer can run few-row calls through the int4 x int8 op."""
        return (self._packed_on_cpu() and self.dense_from_packed
                and cpu_w4a8.serves(self.out_features, self.in_features, self.group_size))

    def attach_w4a8(self, parts: int = 1) -> None:
        """Packs this layer's codes for the int4 x int8 op (loaded: ``cpu_w4a8.load``) and
        runs its calls of fewer rows than the dense switch through it, the activations in
        ``parts`` int8 parts per block."""
        if not self.w4a8_serves():
            raise ValueError("the int4 x int8 op does not serve this layer")
        self.w4a8_parts = parts
        if not self.torch_packed:  # attached already, on its own codes: only the parts change
            self.kernel = f"{cpu_w4a8.KERNEL_NAME}x{parts}"
            Linear.generation += 1
            return
        N, K = self.out_features, self.in_features
        codes = cpu_dequant.int4_unpack(self.packed, N, K)
        sz = self.scale_zero.float().transpose(0, 1)  # [N, K/G, 2]
        self._pack_w4a8(codes, sz[..., 0], sz[..., 1] - 8 * sz[..., 0])
        Linear.generation += 1

    def release_torch_packing(self) -> int:
        """Drops torch's packing of an attached layer (its bytes are returned): the op serves
        the few-row calls, and the dense copy and many-row calls dequantise from the op's
        codes (``cpu_w4a8.dense_t``), so one packed copy of the codes stays, not two. A kept
        copy is rebuilt from them: the many-row calls then read the same values with a copy
        as without (the op keeps its scales in fp16, not torch's bf16 scale / zero)."""
        if not self.w4a8:
            raise ValueError("torch's packing serves this layer: the op is not attached")
        if not self.torch_packed:
            return 0
        freed = sum(self._buffers.pop(name).nbytes for name in ("packed", "scale_zero"))
        self.torch_packed = False
        if self.prefill_weight is not None:
            self.prefill_weight = self._build_copy()
        Linear.generation += 1
        return freed

    def detach_w4a8(self) -> None:
        """Back to torch's int4 kernel for every call (its packing rebuilt from the op's codes
        where it was released: the scales as the op stored them, in fp16). A kept copy stays:
        both read the codes to the same values (``cpu_w4a8.dense_t`` rounds as torch's
        packing does)."""
        if not self.torch_packed:
            self._pack_torch(*cpu_w4a8.unpack(self.w4a8_codes, self._w4a8_scale_min(),
                                              self.group_size))
        for name in ("w4a8_codes", "w4a8_scale_min"):
            self._buffers.pop(name, None)
        self.w4a8 = False
        self.kernel = "torch._weight_int4pack_mm_for_cpu"
        Linear.generation += 1

    @property
    def cpu_kind(self) -> str:
        """The key of this layer's CPU row thresholds (``cpu_dequant.COPY_MIN_ROWS``): the op
        beats the dense copy up to more rows than torch's kernel does."""
        return "int4-w4a8" if self.w4a8 else "int4"

    def _w4a8_scale_min(self) -> torch.Tensor:
        return self.w4a8_scale_min.view(torch.float16)

    def _w4a8_mm(self, x: torch.Tensor) -> torch.Tensor:
        return cpu_w4a8.matmul(x, self.w4a8_codes, self._w4a8_scale_min(), self.w4a8_parts)

    def _dense_copy_possible(self) -> bool:
        return super()._dense_copy_possible() and (self.device.type == "cuda"
                                                   or self.dense_from_packed)

    copy_is_nk = False
    copy_kind = "int4"

    def _gpu_dense(self) -> torch.Tensor:
        return gpu_dequant.int4_dense(self.packed, self.scale_min, self.group_size)

    def _dense_for_prefill(self) -> torch.Tensor:  # W.T [K, N], the many-row pass's layout
        if not self.torch_packed:
            return cpu_w4a8.dense_t(self.w4a8_codes, self._w4a8_scale_min(), self.dtype)
        return cpu_dequant.int4_dense_t(self.packed, self.scale_zero, self.group_size,
                                        self.dtype)

    def copy_matmul(self, x: torch.Tensor) -> torch.Tensor:
        return self._copy_mm(x)  # int4_matmul without its dequantising pass

    def dequantized(self) -> torch.Tensor:
        K, G = self.in_features, self.group_size
        if self.device.type == "cpu" and not self.torch_packed:
            return cpu_w4a8.dequantize(self.w4a8_codes, self._w4a8_scale_min())
        if self.device.type == "cpu":
            # Read back through the kernel itself: W.T = mm(I, packed) (exact for one-hot rows).
            eye = torch.eye(K, dtype=self.dtype)
            return torch._weight_int4pack_mm_for_cpu(eye, self.packed, G,
                                                     self.scale_zero).float().t()
        return quant_kernels.dequantize_int4(self.packed, self.scale_min, G).float()

    def few_rows_fn(self) -> tuple[Callable[[torch.Tensor], torch.Tensor], str | None]:
        if not self._packed_on_cpu():
            return super().few_rows_fn()
        if self.w4a8:
            codes, scale_min = self.w4a8_codes, self._w4a8_scale_min()
            parts = self.w4a8_parts
            return self._with_bias(lambda x: cpu_w4a8.matmul(x, codes, scale_min, parts),
                                   self.cpu_kind)
        packed, scale_zero, G = self.packed, self.scale_zero, self.group_size
        return self._with_bias(
            lambda x: torch._weight_int4pack_mm_for_cpu(x, packed, G, scale_zero),
            self.cpu_kind)

    def adds_residual(self, x: torch.Tensor) -> bool:
        return (self.device.type == "cuda" and self.triton and self.bias is None
                and quant_kernels.int4_split_norm_runs(x, self.group_size))

    def one_token_added(self, x: torch.Tensor, residual: torch.Tensor
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        return quant_kernels.int4_gemv_added(x, self.packed, self.scale_min, self.group_size,
                                             residual)

    def one_token_normed(self, x: torch.Tensor, prologue: Prologue) -> torch.Tensor | None:
        if not self.adds_residual(x):  # the same kernel, its other epilogue
            return None
        return quant_kernels.int4_gemv_normed(x, self.packed, self.scale_min, self.group_size,
                                              prologue.norm_w, prologue.ss, prologue.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, K]
        G = self.group_size
        if self.device.type == "cpu":
            if self._through_copy(x, self.cpu_kind):
                y = self.copy_matmul(x)
            elif self.w4a8 and x.shape[0] < cpu_dequant.DENSE_MIN_ROWS["int4-w4a8"]:
                y = self._w4a8_mm(x)
            elif not self.torch_packed:
                y = cpu_w4a8.dense_matmul(x, self.w4a8_codes, self._w4a8_scale_min())
            elif x.shape[0] < cpu_dequant.DENSE_MIN_ROWS["int4"] or not self.dense_from_packed:
                y = torch._weight_int4pack_mm_for_cpu(x, self.packed, G, self.scale_zero)
            else:
                y = cpu_dequant.int4_matmul(x, self.packed, self.scale_zero, G)
        elif (w := self._gpu_copy(x)) is not None:
            return F.linear(x, w, self.bias)
        elif self.triton and x.shape[0] <= TRITON_MAX_M:
            y = quant_kernels.int4_matmul(x, self.packed, self.scale_min, G)
        else:
            y = F.linear(x, gpu_dequant.int4_dense(self.packed, self.scale_min, G))
        return self._add_bias(y)  # [T, N]


class Fp8Linear(_QuantizedLinear):
    """e4m3 codes, one float32 scale per output row: W = codes * scale[:, None]. The matmul
    quantises its input per token too (``fp8_matmul``); the one-token GEMV does not."""

    def __init__(self, out_features: int, in_features: int, bias: bool,
                 device: torch.device, dtype: torch.dtype) -> None:
        if not fp8_matmul.supported(out_features, in_features):
            raise ValueError(f"fp8 weights need both widths in multiples of 16; this layer "
                             f"is {out_features} x {in_features}")
        if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
            raise ValueError("fp8 weights need a GPU of compute capability 8.9 or later "
                             "(Ada, Hopper); use --weights-dtype int8 here")
        super().__init__(out_features, in_features, bias, device, dtype)

    def _new_stage(self) -> dict[str, torch.Tensor]:
        N, K, dev = self.out_features, self.in_features, self.device
        return {"codes": torch.empty(N, K, dtype=fp8_matmul.FP8, device=dev),
                "scale": torch.empty(N, dtype=torch.float32, device=dev)}

    def _codes(self, value: torch.Tensor | GroupQuantized) -> dict[str, torch.Tensor]:
        if isinstance(value, GroupQuantized):
            value = value.dequantize()
        codes, scale = quantize_fp8(value.to(self.device))
        return {"codes": codes, "scale": scale}

    def _pack(self, stage: dict[str, torch.Tensor]) -> None:
        self.register_buffer("codes", stage["codes"].contiguous())  # [N, K] e4m3
        self.register_buffer("scale", stage["scale"].contiguous())  # [N] float32
        self.kernel = "torch._scaled_mm"

    def _dense_copy_possible(self) -> bool:
        return False  # every token count runs the scaled matmul, the CPU's too

    def prefill_kernel(self) -> str:
        return self.kernel

    def dequantized(self) -> torch.Tensor:
        return dequantize_fp8(self.codes, self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [T, K]
        y = fp8_matmul.scaled_matmul(x.contiguous(), self.codes, self.scale.view(1, -1))
        return self._add_bias(y)  # [T, N]

    def after_prologue(self, x: torch.Tensor, prologue: Prologue, ops: StepOps
                       ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        # the norm / SiLU·mul kernel writes the fp8 row itself: no model-dtype row, no
        # second pass to quantise it (1.5 ms of a 1,024-token Llama-2-7B prefill step)
        residual = None
        if prologue.kind == SILU_MUL and ops.silu_mul_fp8 is not None:
            xq, xs = ops.silu_mul_fp8(x)
        elif prologue.normed and ops.add_rms_norm_fp8 is not None:
            xq, xs, residual = ops.add_rms_norm_fp8(x, prologue.residual, prologue.norm_w,
                                                    prologue.eps)
        else:
            return None
        y = fp8_matmul.codes_matmul(xq, xs, self.codes, self.scale.view(1, -1), self.dtype)
        return self._add_bias(y), residual

    def one_token(self, x: torch.Tensor, prologue: Prologue
                  ) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        if not gemv.runs_on(x.device):
            return None
        return gemv.gemv(x.contiguous(), self.codes, self.bias, prologue, scale=self.scale)

    def one_token_kernel(self, fused: bool) -> str:
        return "triton-gemv-fp8" if fused and gemv.runs_on(self.device) else self.kernel
