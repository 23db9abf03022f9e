"""Paged attention over a flat token batch (varlen): decodes first, then prefill chunks.

One step's tokens are laid out flat, ``[T]``: the first ``num_decode`` are single-token
decodes of different sequences, then each prefill chunk's tokens in turn. The step's
``AttentionMetadata`` is built once (device tensors: slot mapping, block tables, context
lengths, query start offsets; plus a few host integers the scheduler already knows), then
``Attention.prepare(meta)`` adds what the chosen backend needs for the whole step, and
every layer calls ``Attention.forward(layer, q, k, v, meta)``, which
1. writes the step's K/V into the paged cache (``slot_mapping``),
2. runs attention for the decodes and for the prefill chunks.

Backends:
- ``triton``: our kernels (``triton_attention``) read the cache in place through the block
  tables; int8/fp8 caches are dequantised inside them.
- ``sdpa`` / ``math``: references. Each sequence's context is gathered from the cache into
  a padded dense tensor (the gather indices and additive masks are built once per step in
  ``prepare``) and handed to ``torch.nn.functional.scaled_dot_product_attention`` or to an
  explicit float32 matmul + softmax. GQA without copying K/V per query head: the ``group``
  query heads that share a KV head are folded into the query-length axis.
  On the CPU, where the paged decode kernel is loaded (``cpu_paged_decode``, CPUs with
  AVX-512F or AVX2, caches in the model dtype or int8), each layer of the sdpa backend is
  one call of it (``PagedDecode.step``, set up once a step in ``prepare``): it stores the
  step's K/V and attends the decode rows, reading their K/V in place through the block
  tables; prefill chunks keep the gather.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F

from backend.layers import cpu_paged_decode
from backend.layers.kv_cache import KVCache

try:  # Triton is optional: the sdpa and math backends run without it
    from backend.layers import triton_attention
except ImportError:  # pragma: no cover - depends on the platform
    triton_attention = None

BACKENDS = ("triton", "sdpa", "math")


@dataclass
class AttentionMetadata:
    """One step's attention inputs. Rows of ``block_tables``/``context_lens`` are the step's
    sequences in batch order: the ``num_decode`` decodes, then one per prefill chunk."""
    slot_mapping: torch.Tensor  # [T] long: cache slot of each token of the step
    block_tables: torch.Tensor  # [S, W] int32 block ids (unused tail entries: any block)
    context_lens: torch.Tensor  # [S] int32: context length after this step (chunk included)
    query_start_loc: torch.Tensor  # [S + 1] int32: first row of each sequence in the batch
    num_decode: int = 0
    # host copies: (q_start, q_len, ctx_len) of each prefill chunk, in batch order
    prefill_spans: list[tuple[int, int, int]] = field(default_factory=list)
    # longest / shortest decode context; None inside CUDA graphs (any length up to W blocks)
    max_decode_context: int | None = None
    min_decode_context: int | None = None
    # CUDA graphs of prefill steps have no host spans: the longest chunk they hold (their
    # prefill token bucket), with the chunks themselves only in query_start_loc
    prefill_query_len: int | None = None
    extra: dict = field(default_factory=dict)  # backend-specific, filled by prepare()

    @property
    def has_prefill(self) -> bool:
        return bool(self.prefill_spans) or self.prefill_query_len is not None


# Decode rows gathering at least this many context tokens in one step attend a quantised
# CPU cache in float32, the dtype its values are dequantised in, instead of rounding the
# whole gathered context to bf16 first (a pass of its own). SmolLM2 on the 2-core AVX-512
# VM, int8 K/V, decode step: 4 x ~270 tokens even, 8 x ~270 -11 %, 32 x ~270 -19 %, one
# sequence +7 % (SDPA's float32 call costs more than the rounding saves there).
F32_DECODE_MIN_TOKENS = 1024


# Query positions per SDPA call in a CPU prefill chunk (``_prepare_dense``). A 512-token
# prompt's attention per SmolLM2 layer on the 2-core AVX-512 VM: one call 3.99 ms, tiles of
# 64 / 128 / 256 3.05 / 3.00 / 3.53 ms; 1,024 tokens 16.55 against 11.1 / 12.07 / 13.63 ms.
CPU_PREFILL_Q_TILE = 128


def causal_chunk_mask(start: int, q_len: int, group: int, device: torch.device,
                      dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, group * q_len, start + q_len] additive mask: query i (at position start + i)
    sees keys <= it. Additive float, built once per step: SDPA would otherwise convert a
    boolean mask to this form again in every layer."""
    ctx = start + q_len
    rows = torch.arange(start, ctx, device=device).unsqueeze(1)  # [q, 1]
    blocked = torch.arange(ctx, device=device).unsqueeze(0) > rows  # [q, ctx]
    mask = torch.zeros(q_len, ctx, dtype=dtype, device=device).masked_fill_(blocked, -torch.inf)
    return mask.repeat(group, 1).view(1, 1, group * q_len, ctx)


def math_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Explicit reference: softmax(q k^T * scale + mask) v, in float32."""
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask.float()
    return torch.matmul(torch.softmax(scores, dim=-1), v.float()).to(q.dtype)


def block_slots(block_tables: torch.Tensor, block_size: int, width: int) -> torch.Tensor:
    """[S, W] block ids -> [S, width] slot indices of positions 0..width-1."""
    nb = -(-width // block_size)
    offs = torch.arange(block_size, device=block_tables.device)
    slots = block_tables[:, :nb].long().unsqueeze(-1) * block_size + offs  # [S, nb, bs]
    return slots.view(block_tables.shape[0], -1)[:, :width]


class Attention:
    """Attention for all layers; holds no weights, only the backend choice and the cache."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int, backend: str,
                 kv_cache: KVCache, sdpa_context: Callable[[], contextlib.AbstractContextManager]
                 | None = None) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"attention backend must be one of {', '.join(BACKENDS)}; "
                             f"got {backend!r}")
        if backend == "triton" and triton_attention is None:
            raise ValueError("attention 'triton' needs the triton package")
        if (backend == "triton" and kv_cache is not None and kv_cache.scales is not None
                and not kv_cache.kernel_layout):
            raise ValueError("attention 'triton' reads a quantised cache in its kernels' layout "
                             "(int8 V transposed within each block, scales by head): a cache "
                             "built with kernel_layout=False holds the torch path's")
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.group = num_heads // num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5
        self.backend = backend
        self.kv_cache = kv_cache
        # On CUDA: a sdpa_kernel(...) context restricting SDPA to the backend the startup
        # probe verified, so it can never fall back silently.
        self.sdpa_context = sdpa_context
        # On the CPU: the compiled kernel that reads decode rows' K/V in place
        # (``cpu_paged_decode``), where one was loaded (``backend.engine.aot_kernels``)
        self.cpu_decode: cpu_paged_decode.PagedDecode | None = None

    def cpu_decode_serves(self) -> bool:
        """Whether decode rows may take ``cpu_decode``: the sdpa backend on the CPU over a
        cache in the model dtype, or an int8 one in the torch path's layout."""
        cache = self.kv_cache
        if self.backend != "sdpa" or cache is None or cache.data.device.type != "cpu":
            return False
        if cache.scales is not None and cache.kernel_layout:  # scales by head: Triton's
            return False
        # (fp8's uint8 codes: refused by ``serves``)
        return cpu_paged_decode.PagedDecode.serves(cache.model_dtype, cache.data.dtype,
                                                   self.num_heads, self.num_kv_heads,
                                                   self.head_dim)

    # -- once per step ----------------------------------------------------------------
    def prepare(self, meta: AttentionMetadata) -> AttentionMetadata:
        """Adds the backend's per-step inputs to ``meta`` (device ops only, no host sync,
        so it can run inside a CUDA graph capture)."""
        if self.backend == "triton":
            self._prepare_triton(meta)
        else:
            self._prepare_dense(meta)
        return meta

    def _prepare_triton(self, meta: AttentionMetadata) -> None:
        d = meta.num_decode
        if d:
            kind = "auto" if self.kv_cache is None else self.kv_cache.kv_cache_dtype
            meta.extra["splits"] = triton_attention.decode_splits(
                d, self.num_kv_heads, meta.max_decode_context, meta.block_tables.device, kind)
        if meta.has_prefill:
            # prefill rows of the tables, and query offsets relative to the flat batch;
            # copied when decodes come first: a view d rows in is 16-byte aligned only for
            # some d, and Triton compiles a kernel variant per alignment of its pointers
            rows = (meta.block_tables[d:], meta.context_lens[d:], meta.query_start_loc[d:])
            meta.extra["prefill"] = tuple(t.clone() for t in rows) if d else rows

    def _prepare_dense(self, meta: AttentionMetadata) -> None:
        if meta.prefill_query_len is not None and not meta.prefill_spans:
            raise ValueError(f"attention {self.backend!r} needs the prefill chunks on the "
                             "host (no prefill CUDA graphs)")
        bs, dev = self.kv_cache.block_size, meta.block_tables.device
        dtype = self.kv_cache.model_dtype
        d = meta.num_decode
        if self.cpu_decode is not None:  # the store and the decode rows: one call a layer
            cache = self.kv_cache
            meta.extra["cpu_step"] = self.cpu_decode.step(
                cache.data, cache.scales, bs, meta.slot_mapping, meta.block_tables,
                meta.context_lens, d, self.num_heads, self.scale, dtype)
        elif d:
            C = meta.max_decode_context or meta.block_tables.shape[1] * bs
            idx = block_slots(meta.block_tables[:d], bs, C)  # [D, C]
            attend = dtype
            if (self.kv_cache.scales is not None and dev.type == "cpu"
                    and d * C >= F32_DECODE_MIN_TOKENS):
                attend = torch.float32
            mask = None
            if meta.min_decode_context != C:  # some row is shorter: mask its tail
                blocked = torch.arange(C, device=dev) >= meta.context_lens[:d, None]  # [D, C]
                mask = torch.zeros(d, C, dtype=attend, device=dev).masked_fill_(
                    blocked, -torch.inf).view(d, 1, 1, C)
            meta.extra["decode"] = (idx, mask, attend)
        chunks = []
        # On the CPU a long chunk's queries go in tiles, each against the keys up to its last
        # position only: the CPU's SDPA kernel takes up to 512 keys in one block, so with
        # one call it multiplies out the whole masked upper triangle too
        tile = CPU_PREFILL_Q_TILE if dev.type == "cpu" else None
        for i, (q_start, q_len, ctx) in enumerate(meta.prefill_spans):
            idx = block_slots(meta.block_tables[d + i: d + i + 1], bs, ctx)[0]  # [ctx]
            start, step = ctx - q_len, tile or q_len
            pieces = [(p0, min(p0 + step, q_len),
                       causal_chunk_mask(start + p0, min(step, q_len - p0), self.group, dev,
                                         dtype)) for p0 in range(0, q_len, step)]
            chunks.append((q_start, q_len, idx, pieces))
        meta.extra["prefill"] = chunks

    # -- every layer ------------------------------------------------------------------
    @property
    def rotates_in_store(self) -> bool:
        """Whether ``forward`` can take q and k before RoPE (``rope=(cos, sin)``) and
        rotate them in its KV-store kernel."""
        return self.backend == "triton"

    def forward(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                meta: AttentionMetadata,
                rope: tuple[torch.Tensor, torch.Tensor] | None = None,
                dependent_launch: bool = False) -> torch.Tensor:
        """q: [T, H, hd]; k, v: [T, kvh, hd] -> [T, H * hd]. RoPE is applied to q and k
        already, or (only where ``rotates_in_store``) ``rope`` = (cos, sin) [T, hd] asks the
        store to apply it. ``dependent_launch``: the Triton store and decode kernels launch
        with programmatic dependent launch (``backend.layers.pdl``)."""
        if self.backend == "triton":
            return self._forward_triton(layer, q, k, v, meta, rope, dependent_launch)
        if rope is not None:
            raise ValueError(f"attention {self.backend!r} takes q and k with RoPE applied")
        T, d = q.shape[0], meta.num_decode
        step = meta.extra.get("cpu_step")
        if step is not None:  # the CPU kernel stores K/V and attends the decode rows
            out = torch.empty(T, self.num_heads, self.head_dim, dtype=q.dtype)
            step(layer, q, k, v, out if d == T else out[:d] if d else None)
        else:
            self.kv_cache.write(layer, meta.slot_mapping, k, v)
            if not meta.prefill_spans:  # pure decode step: no output buffer, no copies
                return self._decode(layer, q, meta).view(T, self.num_heads * self.head_dim)
            out = torch.empty(T, self.num_heads, self.head_dim, dtype=q.dtype,
                              device=q.device)
            if d:
                out[:d] = self._decode(layer, q[:d], meta)
        for q_start, q_len, idx, pieces in meta.extra["prefill"]:
            rows = slice(q_start, q_start + q_len)
            out[rows] = self._prefill(layer, q[rows], idx, pieces)
        return out.view(T, self.num_heads * self.head_dim)

    def _forward_triton(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        meta: AttentionMetadata,
                        rope: tuple[torch.Tensor, torch.Tensor] | None,
                        dependent_launch: bool) -> torch.Tensor:
        cache = self.kv_cache
        data = cache.data[layer]
        scales = None if cache.scales is None else cache.scales[layer]
        triton_attention.store_kv(k, v, meta.slot_mapping, data, scales, cache.kv_cache_dtype,
                                  cache.block_size, None if rope is None else (q, *rope),
                                  dependent_launch)
        T = q.shape[0]
        out = torch.empty(T, self.num_heads, self.head_dim, dtype=q.dtype, device=q.device)
        d = meta.num_decode
        if d:
            triton_attention.paged_decode(
                q[:d], data, scales, meta.block_tables, meta.context_lens, out, self.scale,
                cache.block_size, cache.kv_cache_dtype, meta.extra["splits"],
                dependent_launch=dependent_launch)
        if meta.has_prefill:
            tables, lens, starts = meta.extra["prefill"]
            triton_attention.paged_prefill(
                q, data, scales, tables, lens, starts, out, self.scale,
                cache.block_size, cache.kv_cache_dtype)
        return out.view(T, self.num_heads * self.head_dim)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        if self.backend == "math":
            return math_attention(q, k, v, mask, self.scale)
        if self.sdpa_context is None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        with self.sdpa_context():
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)

    def _decode(self, layer: int, q: torch.Tensor, meta: AttentionMetadata) -> torch.Tensor:
        D = q.shape[0]
        idx, mask, attend = meta.extra["decode"]  # attend: the dtype K/V are read in
        kv = self.kv_cache.gather(layer, idx, attend)  # [D, C, 2, kvh, hd]
        k = kv[:, :, 0].transpose(1, 2)  # [D, kvh, C, hd]
        v = kv[:, :, 1].transpose(1, 2)
        qg = q.view(D, self.num_kv_heads, self.group, self.head_dim)  # [D, kvh, g, hd]
        o = self._attend(qg.to(attend), k, v, mask)  # [D, kvh, g, hd]
        return o.reshape(D, self.num_heads, self.head_dim).to(q.dtype)

    def _prefill(self, layer: int, q: torch.Tensor, idx: torch.Tensor,
                 pieces: list[tuple[int, int, torch.Tensor]]) -> torch.Tensor:
        """q: [n, H, hd] of one chunk, idx: [ctx] its context's slots; ``pieces``: (first,
        end) query rows and their causal mask, each against the keys up to its last row."""
        n, kvh, g, hd = q.shape[0], self.num_kv_heads, self.group, self.head_dim
        kv = self.kv_cache.gather(layer, idx)  # [ctx, 2, kvh, hd]
        k = kv[:, 0].transpose(0, 1).unsqueeze(0)  # [1, kvh, ctx, hd]
        v = kv[:, 1].transpose(0, 1).unsqueeze(0)
        start = idx.shape[0] - n  # context before the chunk
        outs = []
        for p0, p1, mask in pieces:
            m, end = p1 - p0, start + p1
            # [m, H, hd] -> [1, kvh, g * m, hd]: rows ordered (group member, position)
            qg = q[p0:p1].view(m, kvh, g, hd).permute(1, 2, 0, 3).reshape(1, kvh, g * m, hd)
            o = self._attend(qg, k[:, :, :end], v[:, :, :end], mask)  # [1, kvh, g * m, hd]
            outs.append(o.view(kvh, g, m, hd).permute(2, 0, 1, 3).reshape(m, self.num_heads, hd))
        return outs[0] if len(outs) == 1 else torch.cat(outs)
