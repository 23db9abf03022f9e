"""A step's model inputs built on the host without per-token Python loops.

Everything a step needs (token ids, positions, KV slots, logits rows, context lengths,
query offsets, block tables) is packed into one int32 NumPy array, copied to the device in
one pinned non-blocking transfer and split there into views. Positions and slots come from
vectorised NumPy arithmetic over the per-sequence (start, length) pairs; the only Python
loops run once per sequence (reading its block table and its token slice).

A token that was sampled by the previous step but not yet read back on the host is held in
``Sequence.token_ids`` as ``pending_token(row)`` (a negative id naming its row in that step's
sampled output). ``resolve_pending`` replaces such ids on the device with the sampled value,
so a decode never waits for the host to learn its input token.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from backend.engine.scheduler import ScheduledBatch


def pending_token(row: int) -> int:
    """The placeholder of a token sampled in row ``row`` of the previous step."""
    return -(row + 1)


def resolve_pending(ids: torch.Tensor, last_sampled: torch.Tensor) -> torch.Tensor:
    """ids [T] (any int dtype, negative = pending) -> [T] long with each pending id replaced
    by ``last_sampled[row]`` (device ops only: it runs inside CUDA-graph captures too)."""
    ids = ids.long()
    rows = (-ids - 1).clamp(min=0)  # [T]; real ids map to row 0, masked out below
    return torch.where(ids < 0, last_sampled.index_select(0, rows), ids)


def host_source(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host array -> tensor to copy to ``device`` from: pinned for CUDA (so the copy can be
    non-blocking; the caching host allocator keeps the block alive until it has run)."""
    t = torch.from_numpy(array)
    return t.pin_memory() if device.type == "cuda" else t


def to_device(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host array -> device tensor: on CUDA one pinned non-blocking copy."""
    if device.type == "cpu":
        return torch.from_numpy(array)
    return host_source(array, device).to(device, non_blocking=True)


# Segments start 16-byte aligned (4 int32 / 2 int64 elements would do; 4 keeps both): Triton
# specialises a kernel on whether each pointer argument is 16-byte aligned, so views at
# offsets that move with the batch's shape would compile a new kernel variant (about a
# second each) whenever a step first meets another alignment pattern.
SEGMENT_ALIGN = 4


def _padded(n: int) -> int:
    return n + (-n % SEGMENT_ALIGN)


@dataclass
class HostStep:
    """One step's inputs on the host (int64 NumPy arrays) and the host integers the
    attention metadata carries."""

    ids: np.ndarray  # [T] token ids; negative = pending placeholder
    positions: np.ndarray  # [T]
    slots: np.ndarray  # [T] cache slot of each token
    rows: np.ndarray  # [N] tokens whose logits are sampled
    context_lens: np.ndarray  # [S] context after this step
    query_start_loc: np.ndarray  # [S + 1]
    block_tables: np.ndarray  # [S, W] block ids, 0-padded
    prefill_spans: list[tuple[int, int, int]]  # (q_start, q_len, context) per prefill chunk
    max_decode_context: int | None
    min_decode_context: int | None

    @property
    def has_pending(self) -> bool:
        return bool((self.ids < 0).any())

    def segments(self) -> list[np.ndarray]:
        """The packed arrays in order: the long part (ids, positions, slots, rows), then the
        int32 part (context lengths, query offsets, block tables)."""
        return [self.ids, self.positions, self.slots, self.rows, self.context_lens,
                self.query_start_loc, self.block_tables.ravel()]

    def packed(self) -> np.ndarray:
        """[sum of padded segment lengths] int32: every segment starts at a multiple of
        ``SEGMENT_ALIGN`` elements (see there why)."""
        parts = []
        for seg in self.segments():
            parts.append(seg)
            pad = -len(seg) % SEGMENT_ALIGN
            if pad:
                parts.append(np.zeros(pad, dtype=seg.dtype))
        return np.concatenate(parts).astype(np.int32)


def build_step(batch: ScheduledBatch, block_size: int) -> HostStep:
    """The flat varlen inputs of ``batch`` (decodes first, then prefill chunks)."""
    seqs = batch.decodes + [s for s, _ in batch.prefills]
    D, S = len(batch.decodes), len(seqs)
    starts = np.fromiter((s.num_computed for s in seqs), dtype=np.int64, count=S)  # [S]
    qlens = np.ones(S, dtype=np.int64)
    qlens[D:] = [n for _, n in batch.prefills]
    ctx = starts + qlens  # [S] context after this step
    qsl = np.zeros(S + 1, dtype=np.int64)
    np.cumsum(qlens, out=qsl[1:])  # [S + 1] query start of each sequence
    T = int(qsl[-1])
    ids: list[int] = [s.token_ids[s.num_computed] for s in batch.decodes]
    for seq, n in batch.prefills:
        ids += seq.token_ids[seq.num_computed:seq.num_computed + n]
    W = -(-int(ctx.max()) // block_size)
    tables = np.zeros((S, W), dtype=np.int64)  # [S, W], 0-padded
    for i, seq in enumerate(seqs):
        row = seq.block_table[:W]
        tables[i, :len(row)] = row
    tok_seq = np.repeat(np.arange(S), qlens)  # [T] sequence of each token
    pos = np.arange(T) - qsl[tok_seq] + starts[tok_seq]  # [T]
    slots = tables[tok_seq, pos // block_size] * block_size + pos % block_size  # [T]
    # logits rows: every decode, then each prefill chunk that reaches its sequence's end
    ends = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=S)
    done = np.flatnonzero(ctx[D:] == ends[D:]) + D
    rows = np.concatenate([np.arange(D), qsl[done + 1] - 1])  # [N]
    dec = ctx[:D]
    spans = [(int(qsl[i]), int(qlens[i]), int(ctx[i])) for i in range(D, S)]
    return HostStep(np.asarray(ids, dtype=np.int64), pos, slots, rows, ctx, qsl, tables,
                    spans, int(dec.max()) if D else None, int(dec.min()) if D else None)


@dataclass
class DeviceStep:
    """The views of one step's packed inputs on the device."""

    input_ids: torch.Tensor  # [T] long (pending placeholders resolved)
    positions: torch.Tensor  # [T] long
    slot_mapping: torch.Tensor  # [T] long
    logits_rows: torch.Tensor  # [N] long
    context_lens: torch.Tensor  # [S] int32
    query_start_loc: torch.Tensor  # [S + 1] int32
    block_tables: torch.Tensor  # [S, W] int32


def split_on_device(host: HostStep, device: torch.device,
                    last_sampled: torch.Tensor) -> DeviceStep:
    """One H2D copy of ``host.packed()``, one cast of its long part, views of the rest."""
    flat = to_device(host.packed(), device)  # [L] int32
    segs = host.segments()
    offsets = np.cumsum([0] + [_padded(len(x)) for x in segs]).tolist()
    views = []
    longs = flat[:offsets[4]].long()  # ids, positions, slots, rows: one cast
    for i, seg in enumerate(segs):
        base = longs if i < 4 else flat
        views.append(base[offsets[i]:offsets[i] + len(seg)])
    ids, pos, slots, rows, ctx, qsl, tables = views
    if host.has_pending:
        ids = resolve_pending(ids, last_sampled)
    return DeviceStep(ids, pos, slots, rows, ctx, qsl,
                      tables.view(len(host.context_lens), host.block_tables.shape[1]))
