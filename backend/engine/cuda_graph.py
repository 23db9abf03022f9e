"""CUDA graphs for decode steps (no-op on CPU: the runner only builds this on CUDA).

Decode inputs have fixed shapes: ``[B]`` token ids, positions and slots, and ``[B, C]``
context slot indices with ``C`` = the whole context (max_model_len rounded to blocks). A
graph is captured per batch size in ``sizes``; a step with ``b`` decodes replays the
smallest captured ``B >= b`` with the padded rows writing to the cache's scratch slot.
"""
from __future__ import annotations

import torch

from backend.engine.attention import AttentionMetadata
from backend.engine.scheduler import ScheduledBatch

_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


class DecodeGraphs:
    def __init__(self, runner, max_batch: int) -> None:
        self.runner = runner
        self.sizes = [b for b in _SIZES if b <= max_batch] or [1]
        self.width = -(-runner.max_model_len // runner.block_size)  # blocks
        B, C, dev = self.sizes[-1], self.width * runner.block_size, runner.device
        self.ids = torch.zeros(B, dtype=torch.long, device=dev)
        self.pos = torch.zeros(B, dtype=torch.long, device=dev)
        self.slots = torch.full((B,), runner.kv_cache.scratch_slot, dtype=torch.long,
                                device=dev)
        self.ctx_idx = torch.zeros(B, C, dtype=torch.long, device=dev)
        self.mask = torch.full((B, 1, 1, C), -torch.inf, dtype=runner.dtype, device=dev)
        self.mask[:, :, :, 0] = 0.0  # padded rows attend to one slot, never to nothing
        self.rows = torch.arange(B, dtype=torch.long, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        self.pool = None
        with torch.inference_mode():
            for b in reversed(self.sizes):  # largest first: smaller ones reuse its pool
                self._capture(b)

    def _forward(self, b: int) -> torch.Tensor:
        meta = AttentionMetadata(slot_mapping=self.slots[:b], num_decode=b,
                                 decode_ctx_idx=self.ctx_idx[:b], decode_mask=self.mask[:b])
        return self.runner.model.forward(self.ids[:b], self.pos[:b], self.runner.attn, meta,
                                         self.rows[:b])

    def _capture(self, b: int) -> None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up: allocator and kernel selection
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
        self.ids[:b] = r.tensor([s.token_ids[s.num_computed] for s in seqs])
        self.pos[:b] = r.tensor([s.num_computed for s in seqs])
        self.slots[:b] = r.tensor([r.slot(s, s.num_computed) for s in seqs])
        self.slots[b:B] = r.kv_cache.scratch_slot
        idx, mask = r.decode_context(seqs, width=self.width)
        self.ctx_idx[:b] = idx
        self.mask[:b] = mask
        self.mask[b:B] = -torch.inf
        self.mask[b:B, :, :, 0] = 0.0
        self.graphs[B].replay()
        return self.outputs[B][:b]
