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

import torch

from backend.engine.scheduler import ScheduledBatch
from backend.layers.attention import AttentionMetadata

_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


class DecodeGraphs:
    def __init__(self, runner, max_batch: int) -> None:
        self.runner = runner
        self.sizes = [b for b in _SIZES if b <= max_batch] or [1]
        self.width = -(-runner.max_model_len // runner.block_size)  # blocks
        B, dev = self.sizes[-1], runner.device
        cache = runner.kv_cache
        self.scratch_block = cache.scratch_slot // cache.block_size
        self.ids = torch.zeros(B, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, dtype=torch.long, device=dev)
        self.slots = torch.full((B,), cache.scratch_slot, dtype=torch.long, device=dev)
        self.block_tables = torch.full((B, self.width), self.scratch_block, dtype=torch.int32,
                                       device=dev)
        self.context_lens = torch.ones(B, dtype=torch.int32, device=dev)
        self.query_start_loc = torch.arange(B + 1, dtype=torch.int32, device=dev)
        self.rows = torch.arange(B, dtype=torch.long, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        with torch.inference_mode():
            for b in reversed(self.sizes):  # largest first: smaller ones reuse its pool
                self._capture(b)

    def _forward(self, b: int) -> torch.Tensor:
        r = self.runner
        meta = r.attn.prepare(AttentionMetadata(
            slot_mapping=self.slots[:b], block_tables=self.block_tables[:b],
            context_lens=self.context_lens[:b], query_start_loc=self.query_start_loc[:b + 1],
            num_decode=b))
        return r.model.forward(self.ids[:b], self.pos[:b], r.attn, meta, self.rows[:b])

    def _capture(self, b: int) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: allocator, kernel selection, Triton compilation
                self._forward(b)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            self.outputs[b] = self._forward(b)
        self.pool = graph.pool()
        self.graphs[b] = graph

    def can_run(self, batch: ScheduledBatch) -> bool:
        return len(batch.decodes) <= self.sizes[-1]

    def run(self, batch: ScheduledBatch) -> torch.Tensor:
        seqs, r = batch.decodes, self.runner
        b = len(seqs)
        B = next(s for s in self.sizes if s >= b)
        lens = [s.num_computed + 1 for s in seqs]
        self.ids[:b] = r.tensor([s.token_ids[s.num_computed] for s in seqs])
        self.pos[:b] = r.tensor([s.num_computed for s in seqs])
        self.slots[:b] = r.tensor([r.slot(s, s.num_computed) for s in seqs])
        self.context_lens[:b] = r.tensor(lens, torch.int32)
        table = r.block_tables(seqs, max(lens))  # [b, nb]: the tail keeps older ids
        self.block_tables[:b, :table.shape[1]] = table
        if B > b:
            self.slots[b:B] = r.kv_cache.scratch_slot
            self.context_lens[b:B] = 1
            self.block_tables[b:B, 0] = self.scratch_block
        self.graphs[B].replay()
        return self.outputs[B][:b]
