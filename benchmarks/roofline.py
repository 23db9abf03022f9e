"""Hardware floors measured in the same run, and what a step of the engine must move or compute.

* copy bandwidth: on CUDA ``benchmarks.attention.copy_bandwidth`` (a device-to-device copy,
  read + written bytes / time); on the CPU the same copy timed with torch.utils.benchmark;
* matmul rate: one square matmul in the model dtype, 2 n^3 / time;
* a decode step reads every weight once plus the K/V of every context it attends
  (``kv_cache.bytes_per_block``); a step computes 2 x (linear weights) FLOPs per token plus
  the LM head per sampled row. Attention FLOPs are left out (about 1 % at 512 tokens on a 7B),
  so the prefill figure is a slight underestimate of the work done.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import triton
from torch.utils import benchmark as tbench

from backend.layers.kv_cache import bytes_per_block
from backend.weights.config import ModelConfig
from benchmarks.attention import copy_bandwidth


@dataclass(frozen=True)
class Floors:
    copy_bytes_per_s: float  # read + written bytes per second of a large copy
    matmul_flops_per_s: float
    matmul_n: int
    dtype: str

    def as_dict(self) -> dict:
        d = asdict(self)
        d["copy_gb_s"] = self.copy_bytes_per_s / 1e9
        d["matmul_tflop_s"] = self.matmul_flops_per_s / 1e12
        return d


def _cpu_seconds(fn) -> float:
    """Median seconds per call of ``fn`` on the CPU (torch.utils.benchmark picks the count),
    on the threads the engine gets (the Timer's own default is one thread)."""
    return tbench.Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads()
                        ).blocked_autorange(min_run_time=0.3).median


def measure_floors(device: torch.device, dtype: torch.dtype) -> Floors:
    """Copy bandwidth and matmul rate of this device, measured now."""
    if device.type == "cuda":
        copy = copy_bandwidth(gib=2.0)
        n = 8192
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        ms = triton.testing.do_bench(lambda: a @ b, warmup=25, rep=200)
        return Floors(copy, 2 * n**3 / (ms * 1e-3), n, str(dtype).removeprefix("torch."))
    nbytes = 256 * 2**20  # well past the CPU's last-level cache
    src = torch.empty(nbytes, dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy = 2 * nbytes / _cpu_seconds(lambda: dst.copy_(src))
    n = 1024
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    return Floors(copy, 2 * n**3 / _cpu_seconds(lambda: a @ b), n,
                  str(dtype).removeprefix("torch."))


def _bytes_per_weight(fmt: str, model_dtype: torch.dtype) -> float:
    """Bytes one weight element takes in a format as /health names it (``bf16``, ``int8``,
    ``int4-g32``): int4 carries a bf16 scale and min per group, int8 a scale per row (≈0)."""
    if fmt.startswith("int4-g"):
        return 0.5 + 4 / int(fmt.removeprefix("int4-g"))
    if fmt == "int8":
        return 1.0
    return {"bf16": 2, "fp16": 2, "fp32": 4}.get(fmt, model_dtype.itemsize)


@dataclass(frozen=True)
class StepCost:
    """What the model reads and computes, per token and per step."""
    layer_params: int  # linear weights of all decoder layers
    head_params: int  # the LM head
    weight_bytes: float  # every linear weight read once (decoder layers + LM head)
    kv_bytes_per_token: float  # one token's K/V across all layers (scales included)

    def decode_step_bytes(self, context_tokens: int) -> float:
        return self.weight_bytes + self.kv_bytes_per_token * context_tokens

    def step_flops(self, tokens: int, sampled: int) -> float:
        return 2.0 * (self.layer_params * tokens + self.head_params * sampled)

    def step_floor_s(self, floors: Floors, tokens: float, sampled: int,
                     context_tokens: float) -> float:
        """The least time a step of ``tokens`` rows (``sampled`` of them sampled) attending
        ``context_tokens`` can take: its matmul FLOPs at the matmul rate or its bytes (weights
        once, the contexts' K/V) at the copy bandwidth, whichever is longer."""
        return max(self.step_flops(tokens, sampled) / floors.matmul_flops_per_s,
                   self.decode_step_bytes(context_tokens) / floors.copy_bytes_per_s)


def step_cost(cfg: ModelConfig, weights_format: str, head_format: str, kv_cache_dtype: str,
              model_dtype: torch.dtype, block_size: int) -> StepCost:
    h, hd = cfg.hidden_size, cfg.head_dim
    per_layer = (h * cfg.num_attention_heads * hd  # q
                 + 2 * h * cfg.num_key_value_heads * hd  # k, v
                 + cfg.num_attention_heads * hd * h  # o
                 + 3 * h * cfg.intermediate_size)  # gate, up, down
    layers = per_layer * cfg.num_hidden_layers
    head = cfg.vocab_size * h
    weight_bytes = layers * _bytes_per_weight(weights_format, model_dtype) + \
        head * _bytes_per_weight(head_format, model_dtype)
    kv = bytes_per_block(cfg.num_hidden_layers, block_size, cfg.num_key_value_heads, hd,
                         kv_cache_dtype, model_dtype) / block_size
    return StepCost(layers, head, weight_bytes, kv)
