"""CUDA graphs for decode steps (no-op on CPU: the runner only builds this on CUDA).

A graph is captured per batch size in ``sizes``; a step with ``b`` decodes replays the
smallest captured ``B >= b``. Its inputs are fixed buffers: ``[B]`` token ids, positions,
slots and context lengths, and the block tables ``[B, W]`` with ``W`` = max_model_len in
blocks. Only the first ``ceil(context / block_size)`` entries of a row are written and
read, so with the Triton backend a replay costs the real context, whatever
max_model_len is (the sdpa/math references gather all ``W`` blocks, masked). Padded rows
(b..B) have a context of one token in the cache's scratch block and write their K/V there.
"""
from __future__ import annotations

import logging

import numpy as np
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from backend.engine.scheduler import ScheduledBatch
from backend.engine.step_inputs import build_step, host_source, resolve_pending
from backend.layers.attention import AttentionMetadata

log = logging.getLogger(__name__)
_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


class DecodeGraphs:
    """Inputs of every graph are views of one int32 staging buffer ``[4 * Bmax + Bmax * W]``:
    ids, positions, slots and context lengths at fixed offsets (``Bmax`` each), then the
    step's block tables ``[B, nb]`` packed. A step fills it with one host-to-device copy;
    one device copy moves the packed tables into ``block_tables [Bmax, W]``; the graph
    itself casts, resolves pending ids (``last_sampled``) and runs the model."""

    def __init__(self, runner, max_batch: int) -> None:
        self.runner = runner
        self.sizes = [b for b in _SIZES if b <= max_batch] or [1]
        self.width = -(-runner.max_model_len // runner.block_size)  # blocks
        Bm, dev = self.sizes[-1], runner.device
        cache = runner.kv_cache
        self.scratch_block = cache.scratch_slot // cache.block_size
        self.staged = torch.zeros(4 * Bm + Bm * self.width, dtype=torch.int32, device=dev)
        self.staged[2 * Bm:3 * Bm] = cache.scratch_slot
        self.staged[3 * Bm:4 * Bm] = 1
        self.block_tables = torch.full((Bm, self.width), self.scratch_block,
                                       dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(Bm + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(Bm, dtype=torch.long, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        # GPU operations (kernels, copies, memsets) of one decode forward, per batch size
        self.kernels_per_step: dict[int, int] = {}
        self.pool = None
        with torch.inference_mode():
            for b in reversed(self.sizes):  # largest first: smaller ones reuse its pool
                self._capture(b)

    def _forward(self, b: int) -> torch.Tensor:
        r, Bm = self.runner, self.sizes[-1]
        head = self.staged[:3 * Bm].long()  # [3 * Bm]: ids, positions, slots
        ids = resolve_pending(head[:b], r.last_sampled)  # [b]
        meta = r.attn.prepare(AttentionMetadata(
            slot_mapping=head[2 * Bm:2 * Bm + b], block_tables=self.block_tables[:b],
            context_lens=self.staged[3 * Bm:3 * Bm + b],
            query_start_loc=self.query_start_loc[:b + 1], num_decode=b))
        return r.model.forward(ids, head[Bm:Bm + b], r.attn, meta, self.rows[:b])

    def _capture(self, b: int) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: allocator, kernel selection, Triton compilation
                self._forward(b)
            self.kernels_per_step[b] = count_gpu_ops(lambda: self._forward(b))
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[b] = self._forward(b)
        self.pool = graph.pool()
        self.graphs[b] = graph

    def can_run(self, batch: ScheduledBatch) -> bool:
        return len(batch.decodes) <= self.sizes[-1]

    def run(self, batch: ScheduledBatch) -> torch.Tensor:
        r, Bm = self.runner, self.sizes[-1]
        b = len(batch.decodes)
        B = next(s for s in self.sizes if s >= b)
        host = build_step(batch, r.block_size)
        nb = host.block_tables.shape[1]
        staged = np.zeros(4 * Bm + B * nb, dtype=np.int32)
        staged[2 * Bm:3 * Bm] = r.kv_cache.scratch_slot  # padded rows write the scratch block
        staged[3 * Bm:4 * Bm] = 1  # ... and attend to its one token
        for k, values in enumerate((host.ids, host.positions, host.slots, host.context_lens)):
            staged[k * Bm:k * Bm + b] = values
        tables = staged[4 * Bm:].reshape(B, nb)  # [B, nb]
        tables[:b] = host.block_tables  # rows' tails past nb keep older ids, never read
        tables[b:] = self.scratch_block
        self.staged[:len(staged)].copy_(host_source(staged, r.device), non_blocking=True)
        self.block_tables[:B, :nb].copy_(self.staged[4 * Bm:4 * Bm + B * nb].view(B, nb))
        self.graphs[B].replay()
        return self.outputs[B][:b]


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
