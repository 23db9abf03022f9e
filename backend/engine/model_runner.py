"""Runs one scheduled batch on the device: builds the flat varlen inputs, the paged
attention metadata, calls the model and samples. Owns the model, the KV cache and the
attention kernel choice.
"""
from __future__ import annotations

import ctypes
import logging
import os
import time

import torch

from backend.engine import aot_kernels
from backend.engine.aot_kernels import AotKernels
from backend.engine.aot_kernels import attach as attach_aot_kernels
from backend.engine.config import EngineConfig, prefill_dense_budget
from backend.engine.cuda_graph import StepGraphs
from backend.engine.kernels import probe_attention_kernel, resolve_attention
from backend.engine.nvtx import NvtxRanges
from backend.engine.sampler import Sampler
from backend.engine.scheduler import ScheduledBatch
from backend.engine.step_ops import apply_step_ops, resolve_step_ops
from backend.engine.step_inputs import HostStep, build_step, split_on_device
from backend.layers import copy_rows, cpu_fp16, cpu_paged_decode
from backend.layers.attention import Attention, AttentionMetadata
from backend.layers.copy_rows import CopyRows
from backend.layers.kv_cache import KVCache, bytes_per_block
from backend.layers.linear import (PrefillDense, WeightFormat, keep_prefill_dense,
                                   keeps_file_codes, resolve_weight_format)
from backend.model import LlamaModel
from backend.weight_scaling import (CALIBRATION_TEXT, ScalingReport, not_applied,
                                    scale_and_quantize)

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


def cpu_packed_kernels_fast() -> bool:
    """Whether torch's packed int8 / int4 CPU matmuls run vectorised here (AVX-512). With
    AVX2 alone they lost to a dense float32 matmul at every row count timed (SmolLM2's
    gate_up on a 2-core VM, ad hoc: int4 about 10x slower at one row and 70x at 64, int8
    2.6x at one row), so ``--weights-dtype auto`` keeps a file's codes only where this
    holds."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def int8_head_rows_kernel() -> bool:
    """Whether an int8 LM head on the CPU runs ``cpu_int8_rows`` for all its calls instead
    of torch's int8 kernel and the one-row GEMV package: where those are unvectorised (no
    AVX-512)."""
    return not cpu_packed_kernels_fast()


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """auto: bfloat16 on CUDA and on CPUs with native bf16 (half the weight bytes per
    decode step, twice the matmul rate on AVX512-BF16); float32 on other CPUs, where bf16
    is emulated and slower."""
    if name == "auto":
        if device.type == "cpu" and not cpu_has_native_bf16():
            return torch.float32
        return torch.bfloat16
    return _DTYPES[name]


def return_freed_heap() -> bool:
    """Hands the C heap's free pages back to the OS (glibc's ``malloc_trim``; False where
    there is none). Loading frees many blocks under malloc's mmap threshold (staging
    buffers; torch's int4 packing where the int4 x int8 op replaced it), which stay in the
    heap and in the resident size until trimmed: 151-182 MiB for SmolLM2 on the CPU with
    the op (docs/BENCHMARKS.md "One packed copy of the int4 codes")."""
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return False
    trim(0)
    return True


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
            self.weights_scaling = not_applied(config.weights_scaling,
                                               "a shared model: as the engine that built it")
        else:
            self.model, self.weights_scaling = self._build_model(config, source, max_model_len)
        # After loading: the copies are built from the packed codes, never from a float file.
        # On CUDA before the KV cache, which is sized from the memory they leave; on the CPU
        # after the kernels are attached, where the int4 x int8 op replaces torch's packing of
        # the codes and copies built before it would be built again from the op's.
        if self.device.type == "cuda":
            self._keep_prefill_dense()
        self.num_blocks = self._num_blocks(cfg)
        self.attention = resolve_attention(config.attention, self.device)
        self.kv_cache = KVCache(cfg.num_hidden_layers, self.num_blocks, self.block_size,
                                cfg.num_key_value_heads, cfg.head_dim, self.dtype,
                                config.kv_cache_dtype, self.device,
                                kernel_layout=self.attention == "triton")
        self.group = cfg.num_attention_heads // cfg.num_key_value_heads
        self.attention_kernel, sdpa_context = probe_attention_kernel(
            self.attention, self.device, self.dtype, cfg.num_key_value_heads, self.group,
            cfg.head_dim, config.kv_cache_dtype, self.block_size)
        self.attn = Attention(cfg.num_attention_heads, cfg.num_key_value_heads,
                              cfg.head_dim, self.attention, self.kv_cache, sdpa_context)
        self.sampler = Sampler(source.tokenizer.eos_token_ids, self.device)
        # before the decode graphs: they capture the chosen (and compiled) pieces
        self.compile_info = apply_step_ops(
            self.model, resolve_step_ops(config.compile, config.fused_ops, self.device),
            self.attn, self.kv_cache.scratch_slot, self.block_size)
        self.aot_kernels: AotKernels = attach_aot_kernels(
            self.model, self.attn, config.cpu_aot_kernels, config.cpu_int4_activations,
            int8_rows=self.device.type == "cpu" and int8_head_rows_kernel())
        if self.attn.cpu_decode is not None:  # decode rows run our kernel, prefill SDPA
            self.attention_kernel = f"{self.attention_kernel}+{cpu_paged_decode.KERNEL_NAME}"
        if self.device.type != "cuda":
            self._keep_prefill_dense()
        return_freed_heap()
        self.gpu_copy_rows = self._gpu_copy_rows()
        # [max_num_seqs] long: the latest step's sampled ids, where the next step's inputs
        # read tokens the host has not seen yet (a fixed buffer: CUDA graphs read it too)
        self.last_sampled = torch.zeros(config.max_num_seqs, dtype=torch.long,
                                        device=self.device)
        self.graphs = None
        self.last_graphed: bool | None = None  # whether a graph ran the latest step
        if config.cuda_graph and self.device.type == "cuda":
            self.graphs = StepGraphs(self, config.max_num_seqs, self.graph_prefill_tokens(),
                                     mixed=self.attention == "triton")

    def _build_model(self, config: EngineConfig, source, max_model_len: int
                     ) -> tuple[LlamaModel, ScalingReport]:
        dense = WeightFormat("dense", torch.float16) if self._auto_fp16(config) \
            else WeightFormat()
        fmt = resolve_weight_format(config.weights_dtype, config.int4_group_size,
                                    source.weight_quantization,
                                    self._codes_fast(config, source.weight_quantization), dense)
        head_dtype = config.lm_head_dtype
        if head_dtype == "auto":
            # the file's Q8_0 head beside quantised layers, where int8 matmuls are fast (on
            # CUDA, AVX-512, or through ``cpu_int8_rows`` where it is built); else auto's
            # float choice for this machine (fp16 where fbgemm runs it): the head is a
            # small model's largest matmul, and torch's int8 kernel without AVX-512 took
            # 20-136 ms at 1-4 rows for SmolLM2's (docs/BENCHMARKS.md)
            int8_fast = self.device.type == "cuda" or cpu_packed_kernels_fast() or (
                int8_head_rows_kernel()
                and aot_kernels.int8_rows_ready(config.cpu_aot_kernels, self.dtype))
            head = WeightFormat.parse("int8", config.int4_group_size) \
                if fmt.kind != "dense" and source.head_quantization == "int8" and int8_fast \
                else dense
        elif head_dtype != "model":
            head = WeightFormat.parse(head_dtype, config.int4_group_size)
        else:  # the model dtype, or auto's fp16: the head is a small model's largest matmul
            head = fmt if fmt == dense else WeightFormat()
        mode = config.weights_scaling
        if fmt.kind == "dense":
            report = not_applied(mode, "dense weights")
        elif source.weights is None:
            report = not_applied(mode, "synthetic weights: nothing to calibrate on")
        elif keeps_file_codes(fmt, source.weight_quantization):
            report = not_applied(mode, "the file's own int4 codes are kept as they are")
        elif mode == "none":
            report = not_applied(mode, "none: plain rounding")
        else:
            report = None  # scaled below, on the dense model
        model = LlamaModel(source.config, self.device, self.dtype, max_len=max_model_len,
                           random_init=source.weights is None,
                           weight_format=WeightFormat() if report is None else fmt,
                           lm_head_format=head)
        # A quantised format reads a quantised file's own codes (no float copy of it); the
        # dense layers that calibration needs dequantise them as they load.
        weights = source.packed_weights if fmt.kind != "dense" and \
            source.packed_weights is not None else source.weights
        if weights is not None:
            model.load_weights(weights())
        if report is None:
            tokens = source.tokenizer.encode(CALIBRATION_TEXT.read_text())
            report = scale_and_quantize(model, fmt, tokens)
            if self.device.type == "cuda":
                # The dense layers' memory went back to torch's cache, not the device; the
                # KV cache is sized from what the device reports free next.
                torch.cuda.empty_cache()
            log.info("weights: %s scaled in %.1f s (%s)", fmt.describe(self.dtype),
                     report.seconds, report.reason)
        t0 = time.perf_counter()
        if packed := model.pack_weights():
            log.info("weights: %d layers packed for fbgemm in %.1f s", packed,
                     time.perf_counter() - t0)
        return model, report

    def _codes_fast(self, config: EngineConfig, native: str | None) -> bool:
        """Whether ``--weights-dtype auto`` keeps a file's codes (``native``): on CUDA; on a
        CPU where torch's packed kernels are vectorised (AVX-512); and a file's int4 codes
        where the int4 x int8 op will serve them (``aot_kernels.int4_op_ready``: its AVX2
        build decoded SmolLM2 faster than fp16 weights through fbgemm, docs/BENCHMARKS.md)."""
        if self.device.type == "cuda" or cpu_packed_kernels_fast():
            return True
        return native == "int4" and aot_kernels.int4_op_ready(config.cpu_aot_kernels,
                                                              config.cpu_int4_activations)

    def _auto_fp16(self, config: EngineConfig) -> bool:
        """Whether ``--weights-dtype auto`` stores float weights as fp16 (``cpu_fp16``): on
        a CPU whose auto model dtype is float32 (no native bf16) and where fbgemm runs. An
        explicit ``--dtype float32`` keeps float32 weights."""
        return (config.weights_dtype == "auto" and config.dtype == "auto"
                and self.device.type == "cpu" and self.dtype == torch.float32
                and cpu_fp16.available())

    def graph_prefill_tokens(self) -> int:
        """The largest prefill token bucket captured in CUDA graphs: the step's prefill
        budget, capped by ``cuda_graph_max_tokens`` (0: decode graphs only)."""
        return min(self.config.cuda_graph_max_tokens, self.config.prefill_budget())

    def graph_prefill_chunks(self) -> int | None:
        """The most prefill chunks a captured step holds (None: no graph holds prefill)."""
        return self.graphs.prefill_chunks if self.graphs is not None else None

    def weights_info(self) -> tuple[str, str, str, str, str]:
        """(linear weights' format, the kernel that runs them, the LM head's format, the
        kernel of one-token steps, the kernel of prefill calls), the kernels as the first
        layer's qkv runs them."""
        m = self.model
        qkv = m.layers[0].qkv
        return (m.weight_format.describe(self.dtype), qkv.kernel,
                m.lm_head_format.describe(self.dtype),
                qkv.one_token_kernel(m.ops.fuse_one_token), qkv.prefill_kernel())

    def lm_head_kernel(self) -> str:
        """The kernel of the LM head's one-row calls (a batch-1 decode step's head)."""
        return self.model.lm_head.one_token_kernel(self.model.ops.fuse_one_token)

    def _keep_prefill_dense(self) -> None:
        device_bytes = torch.cuda.get_device_properties(self.device).total_memory \
            if self.device.type == "cuda" else None
        self.prefill_dense: PrefillDense = keep_prefill_dense(
            self.model.modules(), self.config.prefill_dense_weights,
            prefill_dense_budget(self.config.prefill_dense_max_gib, self.device.type,
                                 device_bytes))
        if self.prefill_dense.enabled:
            log.info("dense weight copies (--prefill-dense-weights): %d layers (%.1f MiB)",
                     self.prefill_dense.layers, self.prefill_dense.bytes / 2**20)
        elif self.prefill_dense.needed_bytes:
            log.info("no dense weight copies: %s (--prefill-dense-weights on keeps them)",
                     self.prefill_dense.reason)

    def _gpu_copy_rows(self) -> CopyRows:
        """On CUDA, from how many rows each layer keeping a dense copy multiplies by it
        (before the decode graphs: they capture the path each layer takes)."""
        if self.device.type != "cuda":
            return CopyRows("none", {}, {}, 0.0, "the CPU's crossovers are fixed (cpu_dequant)")
        chosen = copy_rows.choose(self.model.modules(), self.config.gpu_copy_min_rows,
                                  self.model.ops)
        if chosen.mode == "measured":  # --gpu-copy-min-rows auto
            log.info("dense copies from %s rows (timed in %.2f s)",
                     ", ".join(f"{k}: {v}" for k, v in chosen.rows.items()), chosen.seconds)
        return chosen

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

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch) -> "SampledIds":
        """Queue one step on the device: inputs, forward, sampling, and the non-blocking
        copy of the sampled ids to the host. Nothing here waits for the device; the ids
        (one per sequence that completes its uncomputed tokens this step, in order:
        decodes, then finishing prefills) are read with ``SampledIds.tolist()``."""
        stage = "decode" if not batch.prefills else "prefill"
        with self.nvtx.range(stage):
            host = build_step(batch, self.block_size)
            logits = None
            if self.graphs is not None:
                with self.nvtx.range("forward"):
                    logits = self.graphs.run(host, len(batch.decodes), len(batch.prefills))
                self.last_graphed = logits is not None
            if logits is None:  # no graph holds this step's shape
                with self.nvtx.range("prepare"):
                    inputs = self.prepare(batch, host)
                with self.nvtx.range("forward"):
                    logits = self.model.forward(*inputs)
        with self.nvtx.range("sample"):
            tokens = self.sampler.sample(logits, batch.sampled_seqs())  # [N] long
            # the next step's pending input ids are read from here on the device
            self.last_sampled[:tokens.shape[0]].copy_(tokens)
            return SampledIds(tokens)

    def prepare(self, batch: ScheduledBatch, host: HostStep | None = None) -> tuple:
        """Flat inputs: (input_ids [T], positions [T], attn, metadata, logits_indices [N]),
        from one host array (``build_step``, unless given) and one host-to-device copy."""
        host = host if host is not None else build_step(batch, self.block_size)
        dev = split_on_device(host, self.device, self.last_sampled)
        meta = AttentionMetadata(
            slot_mapping=dev.slot_mapping, block_tables=dev.block_tables,
            context_lens=dev.context_lens, query_start_loc=dev.query_start_loc,
            num_decode=len(batch.decodes), prefill_spans=host.prefill_spans,
            max_decode_context=host.max_decode_context,
            min_decode_context=host.min_decode_context)
        self.attn.prepare(meta)
        return (dev.input_ids, dev.positions, self.attn, meta, dev.logits_rows)


class SampledIds:
    """A step's sampled ids on their way to the host: on CUDA a non-blocking copy into
    pinned memory and an event recorded after it; ``tolist()`` waits for that event only."""

    def __init__(self, tokens: torch.Tensor) -> None:
        self.event = None
        if tokens.device.type == "cuda":
            self.host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self.host.copy_(tokens, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.host = tokens  # [N]

    def tolist(self) -> list[int]:
        if self.event is not None:
            self.event.synchronize()
        return self.host.tolist()
