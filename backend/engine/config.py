"""Engine configuration: one frozen pydantic model; unknown keys and bad values are rejected
naming their field."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from backend.schema import Schema, check_choice

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's CPU int4 kernel accepts
# prefill_dense_weights=auto keeps the weight copies (dense copies of the quantised layers;
# on the CPU also oneDNN-reordered copies of bf16 dense layers) when all of them together fit
# a budget. On the CPU this many GiB (SmolLM2-135M's take 0.2 GiB in bf16, a 1 B int4
# model's 2 GiB would not: there the copies would outweigh the codes several times).
PREFILL_DENSE_MAX_GIB = 1.0
# On a GPU this share of its memory: a 7 B model's 12 GiB of bf16 copies on an 80 GB card,
# where int4 served through them matched or beat bf16's output at every batch size and
# kept bf16's TTFT, 7 ms under the per-call pass (docs/BENCHMARKS.md "The sweep with
# quantised weights"); not on a 24 GB card, where they would take most of the KV cache.
GPU_PREFILL_DENSE_SHARE = 0.25


def prefill_dense_budget(max_gib: float | None, device_type: str,
                         device_bytes: int | None = None) -> int:
    """Bytes the weight copies may take under ``prefill_dense_weights=auto``: the setting,
    else a GPU's share of its memory (``device_bytes``), else ``PREFILL_DENSE_MAX_GIB``."""
    if max_gib is not None:
        return int(max_gib * 2**30)
    if device_type == "cuda" and device_bytes:
        return int(device_bytes * GPU_PREFILL_DENSE_SHARE)
    return int(PREFILL_DENSE_MAX_GIB * 2**30)


# The default per-step prefill budget (tokens), below the step's whole budget: on the H200
# sweep (7B, 512-token prompts) it kept TTFT p99 under 200 ms up to 128 streams at the same
# output rate, where the whole 2,048-token budget missed it from 64 (docs/BENCHMARKS.md). A
# 1,024-token chunk is already matmul-bound, so long prompts lose nothing to the extra steps.
DEFAULT_MAX_PREFILL_TOKENS = 1024


def prefill_budget(max_prefill_tokens: int | None, max_num_batched_tokens: int) -> int:
    """Prefill tokens one step may carry: the setting, else the default capped by the step's
    whole budget (the scheduler and the config resolve an unset budget here alike)."""
    return max_prefill_tokens or min(DEFAULT_MAX_PREFILL_TOKENS, max_num_batched_tokens)

MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")
CPU_AOT_MODES = ("auto", "build", "off")
# --cpu-int4-activations: torch's int4 kernel, or the int4 x int8 op in two / one parts
CPU_INT4_ACTIVATIONS = ("model", "int8x2", "int8")

_CHOICES: dict[str, tuple[str, ...]] = {
    "dtype": MODEL_DTYPES,
    "kv_cache_dtype": ("auto", "int8", "fp8_e4m3"),
    "weights_dtype": ("auto", "bf16", "fp16", "fp32", "int8", "int4", "fp8"),
    "lm_head_dtype": ("auto", "model", "int8", "int4"),
    "prefill_dense_weights": ("auto", "on", "off"),
    "weights_scaling": ("activation", "none"),
    "scheduling": ("continuous", "static"),
    "attention": ("auto", "triton", "sdpa", "math"),
    "cpu_aot_kernels": CPU_AOT_MODES,
    "cpu_int4_activations": CPU_INT4_ACTIVATIONS,
}


class EngineConfig(Schema):
    device: str = "cpu"  # "cpu", "cuda", "cuda:1" ...
    dtype: str = "auto"  # auto = bfloat16 on CUDA and on CPUs with native bf16, else float32
    max_num_seqs: int = Field(64, ge=1)  # most sequences in one step
    # token budget of one step (decodes + prefill chunks)
    max_num_batched_tokens: int = Field(2048, ge=1)
    scheduling: str = "continuous"  # or "static": a batch is formed and runs to completion
    attention: str = "auto"  # auto = triton on CUDA, sdpa on CPU; or triton, sdpa, math
    kv_cache_dtype: str = "auto"  # auto = model dtype; "int8"; "fp8_e4m3"
    # Linear-layer weights: auto = a GGUF's own Q8_0/Q4_0/Q4_1 codes kept (int8 / int4),
    # else the model dtype; int8 = per output row; int4 = group-wise (int4_group_size inputs);
    # fp8 = e4m3 per output row, activations quantised per token (backend.layers.fp8_matmul).
    weights_dtype: str = "auto"
    int4_group_size: int = 32
    # The output projection: auto = int8 where the layers are quantised and the file keeps
    # its head (or tied embedding) in Q8_0, as llama.cpp then reads it; else the model
    # dtype. Or the model dtype, int8 or int4 whatever the file.
    lm_head_dtype: str = "auto"
    # int8 / int4 / fp8 rounded from float weights: per-input-channel scales from a calibration
    # pass, folded into the norms and up rows (backend.weight_scaling); none = plain rounding
    weights_scaling: str = "activation"
    # Quantised layers also keep their weight dense in the model dtype, built at load from
    # the codes, for calls of many rows (prefill; on CUDA also decode steps of more than 64
    # rows), which then skip dequantising per call; smaller steps keep the packed kernels.
    # auto = when the copies fit the budget below
    prefill_dense_weights: str = "auto"
    # auto's budget; None = by device (``prefill_dense_budget``)
    prefill_dense_max_gib: float | None = Field(None, ge=0)
    # On CUDA, from how many rows a step multiplies by those copies instead of the codes:
    # None = the fixed crossover (linear.GPU_COPY_MIN_ROWS, 65); "auto" = timed at start for
    # each layer shape (backend.layers.copy_rows); or a row count
    gpu_copy_min_rows: Annotated[int, Field(ge=1)] | Literal["auto"] | None = None
    # One-token CPU steps through code compiled ahead of time (backend.engine.aot_kernels):
    # the int8 LM head's GEMV and the quantised layers' work between attention calls. auto =
    # where a package is in the weights cache; build = compile what is missing at start
    # (10-40 s, once per machine); off = eager
    cpu_aot_kernels: str = "auto"
    # int4 layers' calls of few rows on the CPU (decode steps): int8x2 / int8 = the
    # activations rounded per block of 32 to int8 twice (the value, then its remainder, ~15
    # bits) or once, times the codes by integer dot products (backend.layers.cpu_w4a8, AVX-512
    # VNNI or AVX2; built and loaded with the kernels above, so not with cpu_aot_kernels off;
    # other CPUs keep torch's kernel); model = torch's int4 kernel on activations in the model
    # dtype. int8x2 is torch's kernel's accuracy, and a row's result does not depend on the
    # rows sharing its call; both differ from the dense copies of many-row steps by the same
    # ~0.26 % (docs/BENCHMARKS.md)
    cpu_int4_activations: str = "int8x2"
    kv_cache_memory_gib: float | None = Field(None, gt=0)  # None = sized from free memory
    block_size: int = Field(16, ge=1)  # tokens per KV block
    cuda_graph: bool = True  # capture decode steps on CUDA; no-op on CPU
    # ... and steps carrying up to this many prefill tokens (triton attention; 0 = none)
    cuda_graph_max_tokens: int = Field(2048, ge=0)
    nvtx: bool = False  # emit NVTX ranges (schedule/prefill/decode/sample)
    nvtx_prefix: str = "infer"
    max_model_len: int | None = Field(None, ge=1)  # None = the model's max_position_embeddings
    enable_prefix_caching: bool = True
    # torch.compile of the work between attention calls; None = off (on CUDA the fused
    # Triton kernels below measured faster, docs/BENCHMARKS.md "Whole step")
    compile: bool | None = None
    # our fused Triton kernels for norm/RoPE/SiLU (when not compiled); None = on for CUDA
    fused_ops: bool | None = None
    # prepare and launch step N+1 while the GPU runs step N; None = on for CUDA, off on CPU
    async_scheduling: bool | None = None
    # prefill tokens one step may carry (None = DEFAULT_MAX_PREFILL_TOKENS, or the whole
    # max_num_batched_tokens budget when that is smaller)
    max_prefill_tokens: int | None = Field(None, ge=1)
    # waiting prompts are prefilled before the running decodes get their next token
    prefill_priority: bool = False

    @field_validator(*_CHOICES)
    @classmethod
    def _one_of(cls, value: str, info: ValidationInfo) -> str:
        return check_choice(info.field_name, value, _CHOICES[info.field_name])

    @field_validator("int4_group_size")
    @classmethod
    def _group_size(cls, value: int) -> int:
        if value not in INT4_GROUP_SIZES:
            sizes = ", ".join(map(str, INT4_GROUP_SIZES))
            raise ValueError(f"int4_group_size must be one of {sizes}; got {value}")
        return value

    @field_validator("max_prefill_tokens")
    @classmethod
    def _prefill_budget(cls, value: int | None, info: ValidationInfo) -> int | None:
        step = info.data.get("max_num_batched_tokens")
        if value is not None and step is not None and value > step:
            raise ValueError(f"max_prefill_tokens ({value}) must not exceed "
                             f"max_num_batched_tokens ({step}), the budget of the whole step")
        return value

    @field_validator("prefill_priority")
    @classmethod
    def _priority_needs_continuous(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("scheduling") == "static":
            raise ValueError("prefill_priority needs scheduling=continuous (a static batch "
                             "admits prompts only when nothing runs)")
        return value

    def prefill_budget(self) -> int:
        """Prefill tokens one step may carry, the default resolved."""
        return prefill_budget(self.max_prefill_tokens, self.max_num_batched_tokens)

    def scheduling_policy(self) -> dict[str, Any]:
        """The step policy as /health reports it (the prefill budget resolved)."""
        return {"scheduling": self.scheduling, "max_num_seqs": self.max_num_seqs,
                "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_prefill_tokens": self.prefill_budget(),
                "prefill_priority": self.prefill_priority}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "EngineConfig":
        return cls.model_validate(data)
