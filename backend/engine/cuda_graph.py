"""CUDA graphs for engine steps (no-op on CPU: the runner only builds this on CUDA).

A graph is captured per step shape ``(B, P)``: ``B`` decode rows and ``P`` prefill tokens
(``P = 0``: a pure decode step). A step with ``d`` decodes and ``p`` prefill tokens in at
most ``MAX_CHUNKS`` chunks replays the smallest captured shape with ``B >= d`` and
``P >= p``; a step that fits none runs eagerly. Decode steps get a graph per batch size in
``DECODE_SIZES``; steps that carry prefill chunks (a prompt alone, or chunks beside
running decodes) get coarser decode rows (``MIXED_DECODES``) times prefill token buckets
(``PREFILL_TOKENS``, up to the step's prefill budget), and only with the ``triton``
attention backend, whose kernels take every chunk boundary from device tensors (the
references need them on the host).

Why prefill too: outside a graph a 7B prefill step is bound by the host's launch cost
(hundreds of kernels at 20-40 us of host time each), so a graph takes a 512-token prompt
from host-bound to GPU-bound, and a step mixing chunks with decodes from the slowest step of
a busy server to the cost of its matmuls.

Inputs of every graph are views of one int32 staging buffer, laid out per shape: token ids,
positions and slots ``[B + P]``, logits rows, context lengths ``[B + C]`` and query offsets
``[B + C + 1]`` (``C`` = ``MAX_CHUNKS`` chunk slots when ``P > 0``), then the step's block
tables ``[B + C, nb]`` packed. A step fills it with one host-to-device copy; one device copy
moves the packed tables into ``block_tables [B + C, W]`` (``W`` = max_model_len in blocks:
only the first ``ceil(context / block_size)`` entries of a row are written and read, so a
replay costs the real context). Decode rows come first, padded from ``d`` to ``B`` (context
of one token in the cache's scratch block, where they write their K/V); prefill tokens
start at row ``B``, padded to ``P`` (slot: the scratch block; no chunk covers them, so
attention skips them); unused chunk slots have no query rows. The graph itself casts,
resolves pending ids (``last_sampled``), runs the model and returns logits for ``B + C``
rows, of which the step's own come first.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from backend.engine.step_inputs import (SEGMENT_ALIGN, HostStep, host_source,
                                        resolve_pending)
from backend.layers.attention import AttentionMetadata

log = logging.getLogger(__name__)

DECODE_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)
# Decode rows of graphs that also carry prefill: coarse, since a padded decode row costs
# one token of matmul beside hundreds of prefill tokens.
MIXED_DECODES = (0, 16, 32, 64, 128)
PREFILL_TOKENS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
MAX_CHUNKS = 8  # prefill chunks one graphed step may carry


def _ladder(steps: tuple[int, ...], cap: int, least: int = 1) -> list[int]:
    """The steps below ``cap`` and ``cap`` itself (``[]`` when ``cap < least``)."""
    if cap < least:
        return []
    return [s for s in steps if least <= s < cap] + [cap]


@dataclass(frozen=True)
class _Layout:
    """Offsets (int32 elements) of one shape's segments in the staging buffer."""
    B: int
    P: int
    C: int

    @property
    def T(self) -> int:  # token rows
        return self.B + self.P

    @property
    def S(self) -> int:  # sequence rows: decodes, then chunk slots
        return self.B + self.C

    @cached_property
    def offsets(self) -> list[int]:
        """Starts of ids, positions, slots, logits rows, context lens, query offsets and
        block tables, each segment padded to ``SEGMENT_ALIGN``."""
        lens = [self.T, self.T, self.T, self.S, self.S, self.S + 1]
        out = [0]
        for n in lens:
            out.append(out[-1] + n + (-n % SEGMENT_ALIGN))
        return out


class StepGraphs:
    def __init__(self, runner, max_batch: int, max_prefill_tokens: int = 0,
                 mixed: bool = False) -> None:
        """``max_prefill_tokens``: the largest prefill token bucket (0: decode graphs only);
        ``mixed``: capture prefill shapes at all (the attention backend must allow it)."""
        self.runner = runner
        self.sizes = [b for b in DECODE_SIZES if b <= max_batch] or [1]
        Bm = self.sizes[-1]
        self.prefill_tokens = _ladder(PREFILL_TOKENS, max_prefill_tokens if mixed else 0,
                                      least=PREFILL_TOKENS[0])
        self.mixed_decodes = [0] + _ladder(MIXED_DECODES, Bm) if self.prefill_tokens else []
        # the scheduler's cap on a step's prefill chunks; None: no graph holds prefill
        self.prefill_chunks = MAX_CHUNKS if self.prefill_tokens else None
        self.width = -(-runner.max_model_len // runner.block_size)  # blocks
        cache = runner.kv_cache
        self.scratch_slot = cache.scratch_slot
        self.scratch_block = cache.scratch_slot // cache.block_size
        keys = [(b, 0) for b in self.sizes] + [
            (b, p) for b in self.mixed_decodes for p in self.prefill_tokens]
        self.layouts = {k: _Layout(k[0], k[1], MAX_CHUNKS if k[1] else 0) for k in keys}
        Sm = max(lay.S for lay in self.layouts.values())
        head = max(lay.offsets[-1] for lay in self.layouts.values())
        dev = runner.device
        self.staged = torch.zeros(head + Sm * self.width, dtype=torch.int32, device=dev)
        self.block_tables = torch.full((Sm, self.width), self.scratch_block,
                                       dtype=torch.int32, device=dev)
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], torch.Tensor] = {}
        # GPU operations (kernels, copies, memsets) of one decode forward, per batch size
        self.kernels_per_step: dict[int, int] = {}
        self.pool = None
        with torch.inference_mode():
            # largest first: the smaller ones reuse its memory pool
            for key in sorted(keys, key=lambda k: (k[0] + k[1], k), reverse=True):
                self._stage(key, self._pack(key))
                self._capture(key)

    def describe(self) -> dict:
        """The captured shapes, as /health reports them."""
        return {"decode_batch_sizes": self.sizes, "prefill_token_buckets": self.prefill_tokens,
                "decode_rows_with_prefill": self.mixed_decodes,
                "max_prefill_chunks": self.prefill_chunks or 0}

    # -- capture ------------------------------------------------------------------------
    def _forward(self, key: tuple[int, int]) -> torch.Tensor:
        r, lay = self.runner, self.layouts[key]
        o_ids, o_pos, o_slots, o_rows, o_ctx, o_qsl, _ = lay.offsets
        T, S = lay.T, lay.S
        longs = self.staged[:o_ctx].long()  # ids, positions, slots, rows: one cast
        ids = resolve_pending(longs[o_ids:o_ids + T], r.last_sampled)  # [T]
        meta = r.attn.prepare(AttentionMetadata(
            slot_mapping=longs[o_slots:o_slots + T], block_tables=self.block_tables[:S],
            context_lens=self.staged[o_ctx:o_ctx + S],
            query_start_loc=self.staged[o_qsl:o_qsl + S + 1], num_decode=lay.B,
            prefill_query_len=lay.P or None))
        return r.model.forward(ids, longs[o_pos:o_pos + T], r.attn, meta,
                               longs[o_rows:o_rows + S], in_graph=True)  # [S, vocab]

    def _capture(self, key: tuple[int, int]) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: allocator, kernel selection, Triton compilation
                self._forward(key)
            if key[1] == 0:
                self.kernels_per_step[key[0]] = count_gpu_ops(lambda: self._forward(key))
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[key] = self._forward(key)
        self.pool = graph.pool()
        self.graphs[key] = graph

    # -- every step ---------------------------------------------------------------------
    def key_for(self, decodes: int, prefill_tokens: int, chunks: int) -> tuple[int, int] | None:
        """The smallest captured shape that holds the step, or None (run it eagerly)."""
        if not chunks:
            return next(((b, 0) for b in self.sizes if b >= decodes), None)
        if chunks > MAX_CHUNKS:
            return None
        B = next((b for b in self.mixed_decodes if b >= decodes), None)
        P = next((p for p in self.prefill_tokens if p >= prefill_tokens), None)
        return None if B is None or P is None else (B, P)

    def _pack(self, key: tuple[int, int], host: HostStep | None = None,
              decodes: int = 0) -> np.ndarray:
        """The staging array of shape ``key`` holding ``host`` (``decodes`` decode rows
        first), or no sequence at all (every row padded: the capture's inputs)."""
        lay = self.layouts[key]
        B, T, S = lay.B, lay.T, lay.S
        o = lay.offsets
        nb = host.block_tables.shape[1] if host is not None else 1
        buf = np.zeros(o[-1] + S * nb, dtype=np.int32)
        ids, pos, slots, rows, ctx, qsl = (buf[o[i]:o[i] + n] for i, n in
                                           enumerate((T, T, T, S, S, S + 1)))
        tables = buf[o[-1]:].reshape(S, nb)  # [S, nb]
        slots[:] = self.scratch_slot  # padded rows write the scratch block ...
        ctx[:] = 1  # ... and padded decode rows attend to its one token
        tables[:] = self.scratch_block
        qsl[:B + 1] = np.arange(B + 1)
        qsl[B + 1:] = B  # chunk slots without query rows
        if host is None:
            return buf
        D, shift = decodes, B - decodes
        Tp, Cr = len(host.ids) - D, len(host.context_lens) - D
        for dst, src in ((ids, host.ids), (pos, host.positions), (slots, host.slots)):
            dst[:D], dst[B:B + Tp] = src[:D], src[D:]
        N = len(host.rows)  # decodes' rows first, then the finishing chunks' last rows
        rows[:N] = host.rows
        rows[D:N] += shift
        ctx[:D], ctx[B:B + Cr] = host.context_lens[:D], host.context_lens[D:]
        qsl[B:B + Cr + 1] = host.query_start_loc[D:] + shift
        qsl[B + Cr + 1:] = qsl[B + Cr]
        tables[:D], tables[B:B + Cr] = host.block_tables[:D], host.block_tables[D:]
        return buf

    def _stage(self, key: tuple[int, int], buf: np.ndarray) -> None:
        """One host-to-device copy of ``buf`` (from ``_pack``), then one device copy of its
        packed tables into ``block_tables``."""
        lay = self.layouts[key]
        o_tab = lay.offsets[-1]
        nb = (len(buf) - o_tab) // lay.S
        self.staged[:len(buf)].copy_(host_source(buf, self.runner.device), non_blocking=True)
        self.block_tables[:lay.S, :nb].copy_(
            self.staged[o_tab:o_tab + lay.S * nb].view(lay.S, nb))

    def run(self, host: HostStep, decodes: int, chunks: int) -> torch.Tensor | None:
        """Replay the graph that holds the step: its [N, vocab] logits (N = the step's
        sampled rows), or None when no captured shape holds it."""
        key = self.key_for(decodes, len(host.ids) - decodes, chunks)
        if key is None:
            return None
        self._stage(key, self._pack(key, host, decodes))
        self.graphs[key].replay()
        return self.outputs[key][:len(host.rows)]


def count_gpu_ops(fn) -> int:
    """GPU operations one call of ``fn`` launches (torch.profiler; 0 if it cannot trace)."""
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type == DeviceType.CUDA)
    except RuntimeError as exc:  # CUPTI unavailable: the count is a report, not a need
        log.warning("could not count the decode step's kernels: %s", exc)
        return 0
