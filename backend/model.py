"""Llama-family decoder as an ``nn.Module``: Llama 2/3 (GQA, llama3 RoPE scaling), Mistral,
Qwen2 (qkv bias), SmolLM2; tied or untied embeddings. Weights are parameters (quantised
codes buffers), so ``state_dict``, ``.to`` and ``named_parameters`` cover them; the RoPE
tables are non-persistent buffers.

Built straight on the target device and dtype from a ``ModelConfig`` (HF field names), then
filled by ``load_weights`` from HF tensor names. q/k/v and gate/up are fused into one matrix
each at load time, so a layer costs two norms, four matmuls and a handful of elementwise ops
(CPU decode at small batch is bound by per-op overhead as much as by memory).

``forward`` takes a flat, varlen token batch (decodes and prefill chunks mixed), the shared
paged ``Attention`` layer and its step metadata (``backend.layers.attention``); it returns
float32 logits only for the rows the engine samples. Linear layers come from
``backend.layers.linear`` in the weight format asked for (dense or weight-only int8/int4);
embeddings and the LM head stay in the model dtype unless asked. The norms, RoPE and SiLU
run through a ``StepOps`` (``backend.layers.fused_ops``: torch ops or our fused Triton
kernels), or the pieces between attention calls are torch.compiled (``use_step_ops``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from backend.layers import cpu_dequant
from backend.layers.attention import Attention, AttentionMetadata
from backend.layers.fused_ops import EAGER, TRITON, StepOps, rope_signed_, signed_sin
from backend.layers.gemv import ADD_NORM, NORM, SILU_MUL, Prologue
from backend.layers.linear import (DenseLinear, Linear, LinearRows, WeightFormat, frozen,
                                   make_linear, matmul, matmul_into_stream)
from backend.layers.quantize import GroupQuantized
from backend.profiling.ranges import stage


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies, with llama3 / linear scaling applied."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind == "default":
        return inv
    if kind == "linear":
        return inv / float(scaling["factor"])
    if kind == "llama3":
        return _llama3_inv_freq(inv, scaling)
    raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: llama3, linear)")


def _llama3_inv_freq(inv: torch.Tensor, s: dict) -> torch.Tensor:
    # Llama 3.1: long wavelengths are divided by `factor`, short ones kept, the middle band
    # interpolated smoothly between the two.
    factor, lo, hi = float(s["factor"]), float(s["low_freq_factor"]), float(s["high_freq_factor"])
    old_len = float(s["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > old_len / lo, inv / factor, inv)
    smooth = (old_len / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / hi) & ~(wavelen > old_len / lo)
    return torch.where(medium, smoothed, scaled)


STEP_OPS = ("eager", "triton", "compile")
FUSED_MAX_TOKENS = 128  # steps up to this many tokens use the fused kernels (decode graphs)


@dataclass(frozen=True)
class Summed:
    """The residual carried between layers when the layer before added it into its output
    already (``matmul_into_stream``): x is the stream, and ``ss`` the sums of squares of its
    parts, which the next RMSNorm finishes (``Prologue.ss``)."""
    ss: torch.Tensor


def _norm(residual: torch.Tensor | Summed | None, weight: torch.Tensor, eps: float) -> Prologue:
    """The RMSNorm prologue of x given what is carried beside it: nothing (the first layer:
    x is the stream), a residual to add first, or ``Summed``."""
    if isinstance(residual, Summed):
        return Prologue(NORM, None, weight, eps, residual.ss)
    return Prologue(NORM if residual is None else ADD_NORM, residual, weight, eps)


class DecoderLayer(nn.Module):
    """One block. The residual stream is carried beside the hidden state (as in vLLM and
    gpt-fast): a layer takes (x, residual) and returns the next pair, so each residual add
    is fused with the RMSNorm that follows it."""

    def __init__(self, cfg, device: torch.device, dtype: torch.dtype,
                 fmt: WeightFormat = WeightFormat()) -> None:
        super().__init__()
        hd, H, kvh = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads
        hidden, inter = cfg.hidden_size, cfg.intermediate_size
        linear = lambda n, k, bias=False: make_linear(fmt, n, k, bias, device, dtype)  # noqa: E731
        self.input_norm = frozen(torch.empty(hidden, device=device, dtype=dtype))
        # rows: q heads | k heads | v heads
        self.qkv = linear((H + 2 * kvh) * hd, hidden, cfg.attention_bias)
        self.o = linear(hidden, H * hd)
        self.post_norm = frozen(torch.empty(hidden, device=device, dtype=dtype))
        self.gate_up = linear(2 * inter, hidden)  # rows: gate | up
        self.down = linear(hidden, inter)
        self.eps = cfg.rms_norm_eps
        self.H, self.kvh, self.hd, self.inter = H, kvh, hd, inter
        # the pieces between attention calls; replaced by compiled versions by the model
        self.pre_attention_fn = self.pre_attention
        self.post_attention_fn = self.post_attention

    def pre_attention(self, x: torch.Tensor, residual: torch.Tensor | Summed | None,
                      cos: torch.Tensor, sin: torch.Tensor, ops: StepOps = EAGER,
                      rope: bool = True) -> tuple[torch.Tensor, ...]:
        """x, residual: [T, hidden] (residual None in the first layer, ``Summed`` where the
        layer before added it into x already); cos/sin: [T, hd]
        -> q [T, H, hd], k, v [T, kvh, hd] (views of one qkv matrix), residual. Without
        ``rope`` q and k are returned unrotated (attention's KV store rotates them)."""
        norm = _norm(residual, self.input_norm, self.eps)
        qkv, residual = matmul(self.qkv, x, norm, ops)  # [T, (H + 2 kvh) * hd]
        return *self.split_qkv(qkv, cos, sin, ops, rope), residual

    def split_qkv(self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                  ops: StepOps = EAGER, rope: bool = True) -> tuple[torch.Tensor, ...]:
        """qkv [T, (H + 2 kvh) * hd] -> q [T, H, hd], k, v [T, kvh, hd], views of it; with
        ``rope`` q and k rotated in place first."""
        T = qkv.shape[0]
        H, kvh, hd = self.H, self.kvh, self.hd
        if rope:
            ops.rope_(self.qk_heads(qkv), cos, sin)  # in place
        q = qkv[:, : H * hd].view(T, H, hd)
        kv = qkv[:, H * hd:].view(T, 2, kvh, hd)
        return q, kv[:, 0], kv[:, 1]

    def qk_heads(self, qkv: torch.Tensor) -> torch.Tensor:
        """qkv [T, (H + 2 kvh) * hd] -> its q and k heads [T, H + kvh, hd] (a view)."""
        heads = self.H + self.kvh
        return qkv[:, : heads * self.hd].view(qkv.shape[0], heads, self.hd)

    def post_attention(self, out: torch.Tensor, residual: torch.Tensor, ops: StepOps = EAGER
                       ) -> tuple[torch.Tensor, torch.Tensor | Summed]:
        """out: [T, H * hd] attention output -> (MLP output, residual), both [T, hidden];
        where a one-token layer adds the residual into its output itself
        (``matmul_into_stream``), that sum and ``Summed`` instead."""
        attn_out, ss = matmul_into_stream(self.o, out, Prologue(), residual, ops)  # [T, hidden]
        gate_up, residual = matmul(self.gate_up, attn_out,
                                   _norm(residual if ss is None else Summed(ss),
                                         self.post_norm, self.eps), ops)  # [T, 2 inter]
        # silu(gate) * up first
        y, ss = matmul_into_stream(self.down, gate_up, Prologue(SILU_MUL), residual, ops)
        return y, (residual if ss is None else Summed(ss))

    def forward(self, idx: int, x: torch.Tensor, residual: torch.Tensor | Summed | None,
                cos: torch.Tensor, sin: torch.Tensor, attn: Attention,
                meta: AttentionMetadata, ops: StepOps = EAGER
                ) -> tuple[torch.Tensor, torch.Tensor | Summed]:
        in_store = ops.rope_in_kv_store and attn.rotates_in_store
        q, k, v, residual = self.pre_attention_fn(x, residual, cos, sin, ops, not in_store)
        with stage("attention"):  # a profiler range only while a capture runs
            out = attn.forward(idx, q, k, v, meta, (cos, sin) if in_store else None,
                               ops.dependent_launch)  # [T, H * hd]
        return self.post_attention_fn(out, residual, ops)

    def tensors(self, prefix: str) -> Iterator[tuple[str, torch.Tensor | LinearRows]]:
        """(HF name, destination) pairs; fused matrices are filled slice by slice."""
        H, kvh, hd, inter = self.H, self.kvh, self.hd, self.inter
        qs, ks = slice(0, H * hd), slice(H * hd, (H + kvh) * hd)
        vs = slice((H + kvh) * hd, (H + 2 * kvh) * hd)
        yield f"{prefix}.input_layernorm.weight", self.input_norm
        yield f"{prefix}.post_attention_layernorm.weight", self.post_norm
        for proj, rows in (("q", qs), ("k", ks), ("v", vs)):
            yield f"{prefix}.self_attn.{proj}_proj.weight", LinearRows(self.qkv, rows)
            if self.qkv.bias is not None:
                yield f"{prefix}.self_attn.{proj}_proj.bias", self.qkv.bias[rows]
        yield f"{prefix}.self_attn.o_proj.weight", LinearRows(self.o)
        yield f"{prefix}.mlp.gate_proj.weight", LinearRows(self.gate_up, slice(0, inter))
        yield f"{prefix}.mlp.up_proj.weight", LinearRows(self.gate_up, slice(inter, 2 * inter))
        yield f"{prefix}.mlp.down_proj.weight", LinearRows(self.down)


class LayerPieces(Protocol):
    """Compiled work between attention calls for steps of up to ``max_rows`` rows
    (``backend.engine.aot_layers.LayerPieces``)."""

    max_rows: int

    def __call__(self, i: int, out: torch.Tensor, residual: torch.Tensor, cos: torch.Tensor,
                 sin: torch.Tensor) -> list[torch.Tensor]: ...


class LlamaModel(nn.Module):
    def __init__(self, cfg, device: torch.device | str, dtype: torch.dtype,
                 max_len: int | None = None, seed: int = 0, random_init: bool = True,
                 weight_format: WeightFormat = WeightFormat(),
                 lm_head_format: WeightFormat = WeightFormat()) -> None:
        """``weight_format``: every linear layer of the blocks; ``lm_head_format``: the
        output projection (dense = the model dtype; a tied head quantised or in another
        float dtype gets its own copy of the embedding, which stays in the model dtype for
        the lookup)."""
        super().__init__()
        device = torch.device(device)
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.weight_format, self.lm_head_format = weight_format, lm_head_format
        self.embed = frozen(torch.empty(cfg.vocab_size, cfg.hidden_size, device=device,
                                        dtype=dtype))
        self.layers = nn.ModuleList(DecoderLayer(cfg, device, dtype, weight_format)
                                    for _ in range(cfg.num_hidden_layers))
        self.norm = frozen(torch.empty(cfg.hidden_size, device=device, dtype=dtype))
        self.tied_head_copy = cfg.tie_word_embeddings and (
            lm_head_format.kind != "dense" or lm_head_format.dtype not in (None, dtype))
        if cfg.tie_word_embeddings and not self.tied_head_copy:
            self.lm_head: Linear = DenseLinear.over(self.embed)
        else:
            self.lm_head = make_linear(lm_head_format, cfg.vocab_size, cfg.hidden_size, False,
                                       device, dtype)
            if hasattr(self.lm_head, "copy_min_rows"):  # quantised (only the CPU reads it)
                self.lm_head.copy_min_rows = cpu_dequant.HEAD_COPY_MIN_ROWS
        max_len = max_len or cfg.max_position_embeddings
        inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
        freqs = torch.outer(torch.arange(max_len, dtype=torch.float32), inv)  # [L, hd / 2]
        emb = torch.cat((freqs, freqs), dim=-1)  # [L, hd], float32 like HF
        # derived from the config, not weights: outside the state_dict
        self.register_buffer("cos_table", emb.cos().to(device=device, dtype=dtype),
                             persistent=False)
        self.register_buffer("sin_table", emb.sin().to(device=device, dtype=dtype),
                             persistent=False)
        self.step_ops, self.ops = "eager", EAGER
        self.compiled_pieces: list[str] = []
        self._bound_at = -1  # the Linear.generation _matmuls' lists were built at
        self.head_fn = self.head
        if random_init:  # skipped when load_weights follows: it fills every tensor
            self._random_init(seed)

    def _random_init(self, seed: int) -> None:
        """Synthetic weights (the source has none): N(0, 0.02) matrices, unit norms."""
        gen = torch.Generator(device=self.device).manual_seed(seed)
        for name, t in self._destinations().items():
            if name.endswith("norm.weight"):
                t.fill_(1.0)
            elif name.endswith(".bias"):
                t.zero_()
            elif isinstance(t, LinearRows):
                t.load(torch.empty(t.shape, device=self.device, dtype=self.dtype)
                       .normal_(0.0, 0.02, generator=gen))
            else:
                t.normal_(0.0, 0.02, generator=gen)
        self._fill_tied_head()

    def pack_weights(self) -> int:
        """Builds the kernels' own copies of the weights now (fbgemm's packed fp16 layout
        on the CPU) instead of at the first request, whose first step it would otherwise
        stall (2.1 s for SmolLM2 on a 2-core VM); the number of layers packed."""
        return sum(m.pack() for m in self.modules() if isinstance(m, DenseLinear))

    def _fill_tied_head(self) -> None:
        if self.tied_head_copy:
            self.lm_head.load_rows(slice(None), self.embed)

    def _destinations(self) -> dict[str, torch.Tensor | LinearRows]:
        dest = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm}
        if not self.cfg.tie_word_embeddings:
            dest["lm_head.weight"] = LinearRows(self.lm_head)
        for i, layer in enumerate(self.layers):
            dest.update(layer.tensors(f"model.layers.{i}"))
        return dest

    @torch.inference_mode()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor | GroupQuantized]]) -> None:
        """Copy HF-named tensors in (any dtype/device), or a file's quantised codes (kept
        as they are where the layer's format matches); every destination must be filled."""
        dest = self._destinations()
        missing = set(dest)
        for name, tensor in weights:
            if name.endswith("rotary_emb.inv_freq"):
                continue  # recomputed from the config
            if name == "lm_head.weight" and self.cfg.tie_word_embeddings:
                continue  # some tied checkpoints still ship a copy
            if name not in dest:
                raise KeyError(f"unexpected weight {name!r} for this model architecture")
            if tuple(tensor.shape) != tuple(dest[name].shape):
                raise ValueError(f"weight {name}: shape {tuple(tensor.shape)}, "
                                 f"expected {tuple(dest[name].shape)}")
            target = dest[name]
            if isinstance(target, LinearRows):
                target.load(tensor)
            else:
                target.copy_(tensor.dequantize() if isinstance(tensor, GroupQuantized)
                             else tensor)
            missing.discard(name)
        if missing:
            raise KeyError(f"weights missing from the checkpoint: {sorted(missing)[:8]}")
        self._fill_tied_head()

    def use_step_ops(self, kind: str) -> list[str]:
        """How the work between attention calls runs: ``eager`` (torch ops), ``triton``
        (our fused kernels, ``backend.layers.fused_ops``) or ``compile`` (torch.compile of
        the eager pieces around each attention call, dynamic in the token count so one
        compilation serves every batch and prefill length; attention stays outside, and
        no cudagraph mode: the engine captures the compiled code in its own decode graphs).
        Returns the names of the compiled pieces (compiled lazily, on first call)."""
        if kind not in STEP_OPS:
            raise ValueError(f"step ops must be one of {', '.join(STEP_OPS)}; got {kind!r}")
        if kind == "triton" and TRITON is None:
            raise ValueError("step ops 'triton' need the triton package")
        ops = TRITON if kind == "triton" else EAGER
        pieces: list[str] = []

        def compiled(fn):
            return torch.compile(fn, dynamic=True) if kind == "compile" else fn

        for layer in self.layers:
            layer.pre_attention_fn = compiled(layer.pre_attention)
            layer.post_attention_fn = compiled(layer.post_attention)
        self.head_fn = compiled(self.head)
        if kind == "compile":
            pieces = ["DecoderLayer.pre_attention", "DecoderLayer.post_attention",
                      "LlamaModel.head"]
        self.step_ops, self.ops, self.compiled_pieces = kind, ops, pieces
        return pieces

    def head(self, x: torch.Tensor, residual: torch.Tensor | Summed,
             logits_indices: torch.Tensor, ops: StepOps = EAGER) -> torch.Tensor:
        """The last layer's (x, residual) [T, hidden] -> [N, vocab] float32 logits of the
        sampled rows only (the final norm is per token)."""
        x = x.index_select(0, logits_indices)
        if isinstance(residual, Summed):  # x is the stream: the head's kernel norms it
            residual = None
        else:
            residual = residual.index_select(0, logits_indices)
        norm = _norm(residual, self.norm, self.cfg.rms_norm_eps)
        return matmul(self.lm_head, x, norm, ops)[0].float()  # [N, vocab]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, attn: Attention,
                meta: AttentionMetadata, logits_indices: torch.Tensor,
                in_graph: bool = False) -> torch.Tensor:
        """input_ids, positions: [T]; logits_indices: [N] rows to sample -> [N, vocab] fp32.
        ``in_graph``: the call is being captured in a CUDA graph."""
        x = F.embedding(input_ids, self.embed)  # [T, hidden]
        cos, sin = self.cos_table[positions], self.sin_table[positions]  # [T, hd]
        # Larger steps (prefill) run outside CUDA graphs, where a Triton launch costs far
        # more host time than a torch op's and the host becomes the bottleneck (measured
        # on the H200: TTFT 512 tokens 22.3 ms fused vs 16.0 ms eager): eager ops there.
        # A graph replays without host launches, so there the fused kernels run at any size.
        ops = self.ops if in_graph or input_ids.shape[0] <= FUSED_MAX_TOKENS else EAGER
        if ops is EAGER and self.flat_eager and not self.compiled_pieces:
            x, residual = self._eager_layers(x, cos, sin, attn, meta)
        else:
            residual = None
            for i, layer in enumerate(self.layers):
                x, residual = layer(i, x, residual, cos, sin, attn, meta, ops)
        return self.head_fn(x, residual, logits_indices, ops)

    # False: every step runs each layer's own forward (the reference the flat loop is
    # tested against, and the "before" of benchmarks timing it)
    flat_eager = True

    def _eager_layers(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                      attn: Attention, meta: AttentionMetadata
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The blocks with the eager step ops as one flat loop: the torch ops of
        ``DecoderLayer.forward`` under ``EAGER``, in the same order (the same bits),
        without its per-call Python (prologue records, ``matmul``'s kernel choice, module
        calls): about 1 ms of a 12-13 ms SmolLM2 decode step at batch 1 on a 2-core CPU.
        A step of few rows with the compiled layer pieces loaded takes ``_piecewise_layers``
        instead (fused norms: not the same bits). x: [T, hidden] embeddings -> the last
        block's (x, residual)."""
        rows = x.shape[0]
        pieces = self.one_token_layers if rows == 1 else self.few_rows_layers
        if pieces is not None and (rows == 1 or rows <= pieces.max_rows):
            return self._piecewise_layers(pieces, x, cos, sin, attn, meta)
        norm, silu_mul = EAGER.add_rms_norm, EAGER.silu_mul
        residual = None
        sin_signed = signed_sin(sin)  # rope_eager_'s table, once for every layer
        for i, (layer, qkv, o, gate_up, down) in enumerate(self._matmuls(x.shape[0])):
            h, residual = norm(x, residual, layer.input_norm, layer.eps)
            y = qkv(h)
            rope_signed_(layer.qk_heads(y), cos, sin_signed)  # as rope_eager_, in place
            q, k, v = layer.split_qkv(y, cos, sin, rope=False)
            with stage("attention"):
                out = attn.forward(i, q, k, v, meta)  # [T, H * hd]
            h, residual = norm(o(out), residual, layer.post_norm, layer.eps)
            x = down(silu_mul(gate_up(h)))
        return x, residual

    # On the CPU, the work between two attention calls of a step of few rows as one compiled
    # call, where the engine loaded one (``backend.engine.aot_layers``): (i, attention
    # output of layer i, residual, cos, sin) -> layer i + 1's q, k, v and residual; one
    # for one-row steps, one for 2 .. its ``max_rows`` rows
    one_token_layers: Callable[..., list[torch.Tensor]] | None = None
    few_rows_layers: LayerPieces | None = None

    def _piecewise_layers(self, between: Callable[..., list[torch.Tensor]], x: torch.Tensor,
                          cos: torch.Tensor, sin: torch.Tensor, attn: Attention,
                          meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """``_eager_layers`` through compiled pieces: the first layer's norm and q|k|v and
        the last layer's MLP eager, everything between two attention calls ``between``."""
        last = len(self.layers) - 1
        q, k, v, residual = self.layers[0].pre_attention(x, None, cos, sin)
        for i in range(last):
            with stage("attention"):
                out = attn.forward(i, q, k, v, meta)
            q, k, v, residual = between(i, out, residual, cos, sin)
        with stage("attention"):
            out = attn.forward(last, q, k, v, meta)
        return self.layers[last].post_attention(out, residual)

    def _matmuls(self, rows: int) -> list[tuple]:
        """Per block (the block, its qkv, o, gate_up and down matmuls) for a step of
        ``rows`` tokens: each layer's ``few_rows_fn`` where the rows allow (the kernels
        bound once, rebuilt when ``Linear.generation`` moves), else its ``forward``."""
        if self._bound_at != Linear.generation:
            names = ("qkv", "o", "gate_up", "down")
            bound = [(layer, [getattr(layer, n).few_rows_fn() for n in names])
                     for layer in self.layers]
            self._few_rows = [(layer, *(fn for fn, _ in fns)) for layer, fns in bound]
            self._few_rows_kinds = {k for _, fns in bound for _, k in fns} - {None}
            self._forwards = [(layer, *(getattr(layer, n).forward for n in names))
                              for layer in self.layers]
            self._bound_at = Linear.generation
        if all(rows < cpu_dequant.few_rows_limit(k) for k in self._few_rows_kinds):
            return self._few_rows
        return self._forwards
