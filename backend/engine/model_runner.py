"""Runs one scheduled batch on the device: builds the flat varlen inputs, the paged
attention metadata, calls the model and samples. Owns the model, the KV cache and the
attention kernel choice.
"""
from __future__ import annotations

import logging
import os

import torch

from backend.engine.attention import AttentionMetadata, PagedAttention, PrefillChunk, \
    causal_chunk_mask
from backend.engine.config import EngineConfig
from backend.engine.cuda_graph import DecodeGraphs
from backend.engine.kernels import probe_attention_kernel
from backend.engine.kv_cache import KVCache, bytes_per_block
from backend.engine.nvtx import NvtxRanges
from backend.engine.sampler import Sampler
from backend.engine.scheduler import ScheduledBatch
from backend.engine.sequence import Sequence
from backend.layers.linear import WeightFormat, resolve_weight_format
from backend.model import LlamaModel

log = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_CPU_KV_DEFAULT_GIB = 2.0  # cap on CPU when no --kv-cache-memory is given
_CPU_KV_FRACTION = 0.2  # ... and at most this share of the RAM available at start


def cpu_has_native_bf16() -> bool:
    """AVX512-BF16 or AMX: bf16 matmuls run natively (oneDNN) instead of emulated."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA and on CPUs with native bf16 (half the weight bytes per
    decode step, twice the matmul rate on AVX512-BF16); float32 on other CPUs, where bf16
    is emulated and slower."""
    if name == "auto":
        if device.type == "cpu" and not cpu_has_native_bf16():
            return torch.float32
        return torch.bfloat16
    return _DTYPES[name]


class ModelRunner:
    def __init__(self, config: EngineConfig, source, max_model_len: int,
                 nvtx: NvtxRanges, model: LlamaModel | None = None) -> None:
        self.config = config
        self.device = torch.device(config.device)
        self.dtype = resolve_dtype(config.dtype, self.device)
        self.max_model_len = max_model_len
        self.nvtx = nvtx
        self.block_size = config.block_size
        cfg = source.config
        if model is not None:
            if model.cos_table.shape[0] < max_model_len or model.dtype != self.dtype:
                raise ValueError("a shared model must cover max_model_len in the same dtype")
            self.model = model
        else:
            fmt = resolve_weight_format(config.weights_dtype, config.int4_group_size,
                                        source.weight_quantization)
            head = WeightFormat.parse(config.lm_head_dtype, config.int4_group_size) \
                if config.lm_head_dtype != "model" else WeightFormat()
            self.model = LlamaModel(cfg, self.device, self.dtype, max_len=max_model_len,
                                    random_init=source.weights is None, weight_format=fmt,
                                    lm_head_format=head)
            # A quantised format reads a quantised file's own codes (no float copy of it).
            weights = source.packed_weights if fmt.kind != "dense" and \
                source.packed_weights is not None else source.weights
            if weights is not None:
                self.model.load_weights(weights())
        self.num_blocks = self._num_blocks(cfg)
        self.kv_cache = KVCache(cfg.num_hidden_layers, self.num_blocks, self.block_size,
                                cfg.num_key_value_heads, cfg.head_dim, self.dtype,
                                config.kv_cache_dtype, self.device)
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads
        self.attention_kernel, sdpa_context = probe_attention_kernel(
            config.attention, self.device, self.dtype, cfg.num_key_value_heads, self.group,
            cfg.head_dim)
        self.attn = PagedAttention(cfg.num_attention_heads, cfg.num_key_value_heads,
                                   cfg.head_dim, config.attention, self.kv_cache, sdpa_context)
        self.sampler = Sampler(source.tokenizer.eos_token_ids, self.device)
        self.graphs = None
        if config.cuda_graph and self.device.type == "cuda":
            self.graphs = DecodeGraphs(self, max_batch=config.max_num_seqs)

    def weights_info(self) -> tuple[str, str, str]:
        """(linear weights' format, the kernel that runs them, the LM head's format)."""
        m = self.model
        return (m.weight_format.describe(self.dtype), m.layers[0].qkv.kernel,
                m.lm_head_format.describe(self.dtype))

    def _num_blocks(self, cfg) -> int:
        per_block = bytes_per_block(cfg.num_hidden_layers, self.block_size,
                                    cfg.num_key_value_heads, cfg.head_dim,
                                    self.config.kv_cache_dtype, self.dtype)
        if self.config.kv_cache_memory_gib is not None:
            budget = self.config.kv_cache_memory_gib * 2**30
        elif self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            budget = free * 0.85  # headroom for activations and graphs
        else:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
            budget = min(_CPU_KV_DEFAULT_GIB * 2**30, avail * _CPU_KV_FRACTION)
        # More blocks than max_num_seqs full-length sequences can use is wasted memory.
        useful = self.config.max_num_seqs * -(-self.max_model_len // self.block_size)
        blocks = min(int(budget // per_block), useful)
        if blocks < 1:
            raise ValueError(f"KV cache budget {budget / 2**30:.3f} GiB holds no block "
                             f"({per_block} bytes each)")
        log.info("KV cache: %d blocks of %d tokens (%.2f GiB)", blocks, self.block_size,
                 blocks * per_block / 2**30)
        return blocks

    def tensor(self, data: list, dtype: torch.dtype = torch.long) -> torch.Tensor:
        """Host list -> device tensor; on CUDA through pinned memory, without a sync."""
        t = torch.tensor(data, dtype=dtype)
        if self.device.type == "cpu":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def slot(self, seq: Sequence, pos: int) -> int:
        return seq.block_table[pos // self.block_size] * self.block_size + pos % self.block_size

    @torch.inference_mode()
    def run(self, batch: ScheduledBatch) -> list[int]:
        """Forward one step; returns a sampled token for each sequence that completes its
        uncomputed tokens this step, in order: decodes, then finishing prefills."""
        stage = "decode" if not batch.prefills else "prefill"
        with self.nvtx.range(stage):
            if self.graphs is not None and not batch.prefills and self.graphs.can_run(batch):
                logits = self.graphs.run(batch)
            else:
                inputs = self.prepare(batch)
                logits = self.model.forward(*inputs)
        with self.nvtx.range("sample"):
            # the only host sync of a step: the sampled ids
            return self.sampler.sample(logits, batch.sampled_seqs()).tolist()

    def prepare(self, batch: ScheduledBatch) -> tuple:
        """Flat inputs: (input_ids [T], positions [T], attn, metadata, logits_indices [N])."""
        ids, pos, slots, rows = [], [], [], []
        for seq in batch.decodes:
            p = seq.num_computed
            ids.append(seq.token_ids[p])
            pos.append(p)
            slots.append(self.slot(seq, p))
        rows.extend(range(len(batch.decodes)))
        chunks_meta = []
        for seq, n in batch.prefills:
            start = seq.num_computed
            q_start = len(ids)
            ids.extend(seq.token_ids[start:start + n])
            pos.extend(range(start, start + n))
            slots.extend(self.slot(seq, p) for p in range(start, start + n))
            chunks_meta.append((seq, start, n, q_start))
            if start + n == len(seq):
                rows.append(q_start + n - 1)
        dev = self.device
        meta = AttentionMetadata(slot_mapping=self.tensor(slots), num_decode=len(batch.decodes))
        if batch.decodes:
            meta.decode_ctx_idx, meta.decode_mask = self.decode_context(batch.decodes)
        for seq, start, n, q_start in chunks_meta:
            meta.prefills.append(PrefillChunk(
                q_start, n, self.context_slots(seq, start + n),
                causal_chunk_mask(start, n, self.group, dev, self.dtype)))
        return (self.tensor(ids), self.tensor(pos), self.attn, meta, self.tensor(rows))

    def decode_context(self, seqs: list[Sequence], width: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Slot indices [D, C] of each sequence's positions 0..C-1 (padding -> slot 0) and
        the additive mask [D, 1, 1, C], None when no row is padded. C is the longest
        context, or ``width`` blocks (fixed shapes for CUDA graphs)."""
        bs, dev = self.block_size, self.device
        lens = [s.num_computed + 1 for s in seqs]
        C = width * bs if width else max(lens)
        nb = -(-C // bs)
        table = [s.block_table[:nb] + [0] * (nb - len(s.block_table[:nb])) for s in seqs]
        bt = self.tensor(table)  # [D, nb]
        idx = (bt.unsqueeze(-1) * bs + torch.arange(bs, device=dev)).view(len(seqs), -1)
        idx = idx[:, :C]
        if width is None and min(lens) == C:
            return idx, None
        ctx = self.tensor(lens)
        blocked = torch.arange(C, device=dev).unsqueeze(0) >= ctx.unsqueeze(1)  # [D, C]
        mask = torch.zeros(len(seqs), C, dtype=self.dtype, device=dev)
        return idx, mask.masked_fill_(blocked, -torch.inf).view(len(seqs), 1, 1, C)

    def context_slots(self, seq: Sequence, ctx_len: int) -> torch.Tensor:
        """[ctx_len] slot indices of positions 0..ctx_len-1 of seq."""
        bs = self.block_size
        bt = self.tensor(seq.block_table[: -(-ctx_len // bs)])
        return (bt.unsqueeze(-1) * bs + torch.arange(bs, device=self.device)).view(-1)[:ctx_len]
