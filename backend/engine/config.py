"""Engine configuration (one frozen dataclass; unknown keys are rejected by name)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.configutil import dataclass_from_dict

_DTYPES = ("auto", "float32", "bfloat16", "float16")
_KV_DTYPES = ("auto", "int8", "fp8_e4m3")
_WEIGHTS_DTYPES = ("auto", "bf16", "fp16", "fp32", "int8", "int4")
_LM_HEAD_DTYPES = ("model", "int8", "int4")
INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's CPU int4 kernel accepts


@dataclass(frozen=True)
class EngineConfig:
    device: str = "cpu"  # "cpu", "cuda", "cuda:1" ...
    dtype: str = "auto"  # auto = bfloat16 on CUDA and on CPUs with native bf16, else float32
    max_num_seqs: int = 64  # most sequences in one step
    max_num_batched_tokens: int = 2048  # token budget of one step (decodes + prefill chunks)
    scheduling: str = "continuous"  # or "static": a batch is formed and runs to completion
    attention: str = "auto"  # auto = triton on CUDA, sdpa on CPU; or triton, sdpa, math
    kv_cache_dtype: str = "auto"  # auto = model dtype; "int8"; "fp8_e4m3"
    # Linear-layer weights: auto = a GGUF's own Q8_0/Q4_0/Q4_1 codes kept (int8 / int4),
    # else the model dtype; int8 = per output row; int4 = group-wise (int4_group_size inputs).
    weights_dtype: str = "auto"
    int4_group_size: int = 32
    lm_head_dtype: str = "model"  # the output projection: the model dtype, int8 or int4
    kv_cache_memory_gib: float | None = None  # None = sized from free memory
    block_size: int = 16  # tokens per KV block
    cuda_graph: bool = True  # capture decode steps on CUDA; no-op on CPU
    nvtx: bool = False  # emit NVTX ranges (schedule/prefill/decode/sample)
    nvtx_prefix: str = "infer"
    max_model_len: int | None = None  # None = the model's max_position_embeddings
    enable_prefix_caching: bool = True

    def __post_init__(self) -> None:
        _choice("dtype", self.dtype, _DTYPES)
        _choice("kv_cache_dtype", self.kv_cache_dtype, _KV_DTYPES)
        _choice("weights_dtype", self.weights_dtype, _WEIGHTS_DTYPES)
        _choice("lm_head_dtype", self.lm_head_dtype, _LM_HEAD_DTYPES)
        if self.int4_group_size not in INT4_GROUP_SIZES:
            sizes = ", ".join(map(str, INT4_GROUP_SIZES))
            raise ValueError(f"int4_group_size must be one of {sizes}; "
                             f"got {self.int4_group_size}")
        _choice("scheduling", self.scheduling, ("continuous", "static"))
        _choice("attention", self.attention, ("auto", "triton", "sdpa", "math"))
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kv_cache_memory_gib is not None and self.kv_cache_memory_gib <= 0:
            raise ValueError(f"kv_cache_memory_gib must be > 0, got {self.kv_cache_memory_gib}")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise ValueError(f"max_model_len must be >= 1, got {self.max_model_len}")

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EngineConfig":
        return dataclass_from_dict(cls, data)


def _choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}; got {value!r}")
