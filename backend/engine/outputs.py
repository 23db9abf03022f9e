"""What the engine hands back: per-request outputs, timings, engine and step statistics."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RequestTimings:
    """Seconds, measured from the engine's arrival stamp of the request."""

    queue_s: float  # arrival -> first scheduled
    prefill_s: float  # first scheduled -> prompt fully processed (first token sampled)
    first_token_s: float  # arrival -> first token sampled (engine-side TTFT)
    decode_s: float  # first token -> last token
    e2e_s: float  # arrival -> finished


@dataclass(slots=True)  # one per request per step: built and read on the hot path
class RequestOutput:
    request_id: str
    new_token_ids: list[int]  # tokens produced since the previous output of this request
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | "error"
    num_prompt_tokens: int
    num_cached_tokens: int  # prompt tokens served from the prefix cache
    timings: RequestTimings | None  # set on the final output only
    error: str | None = None  # finish_reason "error": why this request broke its step


@dataclass
class EngineStats:
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    preemptions_total: int
    prompt_tokens_total: int
    generation_tokens_total: int
    attention_kernel: str  # the kernel that really ran, e.g. "triton", "cudnn", "math"
    dtype: str = ""  # the model dtype "auto" resolved to (it differs by device and CPU)
    weights_format: str = ""  # linear layers' weights, e.g. "bf16", "int8", "int4-g32"
    linear_kernel: str = ""  # the matmul that runs them, e.g. "torch._weight_int8pack_mm"
    lm_head_format: str = ""
    # the matmul of one-token steps (batch-1 decode): the fused GEMV where it runs
    one_token_kernel: str = ""
    # the matmul of calls with many rows (prefill), e.g. "dense-copy+F.linear"
    prefill_kernel: str = ""
    # the LM head's matmul at one row, e.g. "aot-inductor-int8-gemv"
    lm_head_kernel: str = ""
    # the CPU kernels compiled ahead of time (AotKernels.as_dict())
    cpu_aot_kernels: dict = field(default_factory=dict)
    # the CPU's dense prefill copies of quantised layers (PrefillDense.as_dict())
    prefill_dense_weights: dict = field(default_factory=dict)
    # on CUDA, from how many rows the layers use those copies (CopyRows.as_dict())
    gpu_copy_rows: dict = field(default_factory=dict)
    weights_scaling: dict = field(default_factory=dict)
    # how the work between attention calls ran: {"enabled", "step_ops", "pieces", "seconds"}
    compile: dict = field(default_factory=dict)
    async_scheduling: bool = False  # step N+1 launched while the device runs step N
    # GPU operations (kernels, copies) of one captured decode forward, per graph batch size;
    # empty without CUDA graphs
    decode_kernels_per_step: dict[int, int] = field(default_factory=dict)
    # the step shapes captured in CUDA graphs (StepGraphs.describe()); None without graphs
    cuda_graphs: dict | None = None
    # prefill chunks one step may carry (the graphs' chunk slots); None: no cap
    max_prefill_seqs: int | None = None
    # prompt tokens the prefix cache served (first admissions; of prompt_tokens_total)
    cached_prompt_tokens_total: int = 0


@dataclass
class StepStats:
    """Passed to the step observer once per engine step."""

    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    duration_s: float
    num_prefill_seqs: int = 0  # prefill chunks the step carried
    # whether a CUDA graph ran it (False: no captured shape held it, so it ran eagerly);
    # None without graphs
    graphed: bool | None = None
