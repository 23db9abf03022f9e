"""How the model's work between attention calls runs, chosen once at start-up: ``eager``
(torch ops), ``triton`` (our fused kernels, ``backend.layers.fused_ops``) or ``compile``
(torch.compile of the pieces around each attention call). Compilation is cached by
inductor under the project cache root and done at start-up by a warm-up forward, timed and
reported (``/health`` → ``compile``).

Defaults (measured on an H200, docs/BENCHMARKS.md "Whole step"): on CUDA the fused Triton
kernels; torch.compile only when asked (``compile=True``); on CPU eager (the Triton kernels
need the interpreter there).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import torch

from backend.layers import fused_ops
from backend.layers.attention import Attention, AttentionMetadata
from backend.model import LlamaModel
from backend.weights.paths import cache_root

log = logging.getLogger(__name__)


# EngineConfig fields that select each way explicitly (benchmarks, tools)
STEP_OPS_FIELDS = {"eager": {"compile": False, "fused_ops": False},
                   "triton": {"compile": False, "fused_ops": True},
                   "compile": {"compile": True}}


@dataclass(frozen=True)
class CompileInfo:
    """What ``/health`` reports under ``compile``."""
    enabled: bool
    step_ops: str  # eager | triton | compile
    pieces: list[str] = field(default_factory=list)
    seconds: float = 0.0  # the start-up warm-up (compilation included)

    def as_dict(self) -> dict:
        return {"enabled": self.enabled, "step_ops": self.step_ops, "pieces": self.pieces,
                "seconds": round(self.seconds, 3)}


def resolve_step_ops(compile_: bool | None, fused_ops_: bool | None,
                     device: torch.device) -> str:
    """compile (None = off: on the H200 the fused kernels were faster) wins over fused_ops
    (None = on for CUDA, off on CPU)."""
    if compile_:
        return "compile"
    fused = device.type == "cuda" if fused_ops_ is None else fused_ops_
    if fused:
        if not fused_ops.AVAILABLE:
            raise ValueError("fused_ops needs the triton package")
        if device.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
            raise ValueError("fused_ops on the CPU needs TRITON_INTERPRET=1 (slow; tests)")
        return "triton"
    return "eager"


def use_inductor_cache() -> str:
    """Inductor's on-disk cache under the project cache root, unless the user chose one."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_root() / "inductor")
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


def warm_up(model: LlamaModel, attn: Attention, scratch_slot: int, block_size: int) -> None:
    """Forward dummy steps of 1 and 2 tokens whose K/V go to the cache's scratch block,
    sampling all, one or none of their rows: compiles every piece for a single token and
    for the dynamic token count (0 and 1 are specialised by dynamo), which every longer
    batch or prefill chunk reuses."""
    dev = model.device
    for b, rows in ((1, [0]), (2, [0, 1]), (2, [1]), (2, [])):
        meta = attn.prepare(AttentionMetadata(
            slot_mapping=torch.full((b,), scratch_slot, dtype=torch.long, device=dev),
            block_tables=torch.full((b, 1), scratch_slot // block_size, dtype=torch.int32,
                                    device=dev),
            context_lens=torch.ones(b, dtype=torch.int32, device=dev),
            query_start_loc=torch.arange(b + 1, dtype=torch.int32, device=dev),
            num_decode=b, max_decode_context=1, min_decode_context=1))
        ids = torch.zeros(b, dtype=torch.long, device=dev)
        model.forward(ids, torch.zeros_like(ids), attn, meta,
                      torch.tensor(rows, dtype=torch.long, device=dev))


def apply_step_ops(model: LlamaModel, kind: str, attn: Attention, scratch_slot: int,
                   block_size: int) -> CompileInfo:
    """Switch the model to ``kind``; for ``compile`` compile now (logged and timed)."""
    if kind == "compile":
        cache = use_inductor_cache()
        log.info("torch.compile of the step pieces (cache %s) ...", cache)
    pieces = model.use_step_ops(kind)
    t0 = time.perf_counter()
    if kind == "compile":
        with torch.inference_mode():
            warm_up(model, attn, scratch_slot, block_size)
        if model.device.type == "cuda":
            torch.cuda.synchronize(model.device)
    seconds = time.perf_counter() - t0
    if kind == "compile":
        log.info("compiled %s in %.1f s", ", ".join(pieces), seconds)
    return CompileInfo(kind == "compile", kind, pieces, seconds)
