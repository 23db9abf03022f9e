"""``python -m backend``: parse flags into ServerConfig/EngineConfig and serve."""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Sequence

from pydantic import ValidationError

from backend.engine.config import (CPU_AOT_MODES, CPU_INT4_ACTIVATIONS,
                                   DEFAULT_MAX_PREFILL_TOKENS, GPU_PREFILL_DENSE_SHARE,
                                   MODEL_DTYPES, PREFILL_DENSE_MAX_GIB, EngineConfig)
from backend.schema import describe
from backend.server.config import DEFAULT_MODEL, PROFILE_TOKEN_ENV, ServerConfig


def rows_or_auto(value: str) -> int | str:
    """``auto`` (measured at start) or a row count."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected auto or a row count, got {value!r}") \
            from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m backend",
        description="firsttoken backend: an OpenAI-compatible server over our PyTorch engine.")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="smollm2-135m-instruct (embedded), a Hugging Face model directory, "
                        "a .gguf file, or synthetic:<preset> (default: %(default)s)")
    p.add_argument("--served-model-name", default=None,
                   help="model id shown by /v1/models and accepted in requests "
                        "(default: the model's own name)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="auto", choices=MODEL_DTYPES)
    p.add_argument("--max-num-seqs", type=int, default=64, help="most sequences in one step")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048,
                   help="token budget of one step (decodes first, then prefill chunks)")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="context length (default: the model's max_position_embeddings)")
    p.add_argument("--scheduling", default="continuous", choices=("continuous", "static"))
    p.add_argument("--attention", default="auto", choices=("auto", "triton", "sdpa", "math"),
                   help="auto = triton on CUDA, sdpa on CPU; triton on CPU needs "
                        "TRITON_INTERPRET=1")
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "int8", "fp8_e4m3"))
    p.add_argument("--weights-dtype", default="auto",
                   choices=("auto", "bf16", "fp16", "fp32", "int8", "int4", "fp8"),
                   help="linear-layer weights: auto keeps a GGUF's Q8_0/Q4_0/Q4_1 codes "
                        "(int8/int4), else the model dtype; int8 = per output channel, "
                        "int4 = group-wise (both weight-only); fp8 = e4m3 per output "
                        "channel with activations quantised per token (fp8 tensor-core "
                        "matmuls: faster prefill; CUDA needs compute capability 8.9+) "
                        "(default: %(default)s)")
    p.add_argument("--int4-group-size", type=int, default=32, choices=(32, 64, 128, 256),
                   help="inputs per int4 scale/min pair (default: %(default)s)")
    p.add_argument("--weights-scaling", default="activation", choices=("activation", "none"),
                   help="int8/int4/fp8 rounded from float weights: activation = per-input-channel "
                        "scales chosen on a calibration text at load (activation-aware, as "
                        "AWQ), folded into the preceding norm and up weights, so nothing "
                        "changes at run time; none = plain rounding. A GGUF's own int4 codes "
                        "are kept as they are either way (default: %(default)s)")
    p.add_argument("--lm-head-dtype", default="auto", choices=("auto", "model", "int8", "int4"),
                   help="the output projection's weights: auto = int8 where the linear "
                        "layers are quantised and the file stores the head (or the tied "
                        "embedding) as Q8_0, else the model dtype (default: %(default)s)")
    p.add_argument("--prefill-dense-weights", default="auto", choices=("auto", "on", "off"),
                   help="quantised layers also keep their weight dense in the model dtype, "
                        "built once at load from the codes (on the CPU bf16 copies reordered "
                        "for oneDNN), for calls of many rows (prefill, larger decode batches: "
                        "on CUDA more than 64 rows), which then skip "
                        "dequantising per call; small decode batches keep the packed kernels. "
                        "On the CPU bf16 dense layers keep a copy reordered for oneDNN that "
                        "every call uses. auto = on when all copies fit "
                        "--prefill-dense-max-gib (default: %(default)s)")
    p.add_argument("--prefill-dense-max-gib", type=float, default=None, metavar="GiB",
                   help="memory the weight copies may take under --prefill-dense-weights "
                        f"auto (default: {PREFILL_DENSE_MAX_GIB:g} GiB on the CPU, on a GPU "
                        f"{GPU_PREFILL_DENSE_SHARE * 100:g}%% of its memory)")
    p.add_argument("--gpu-copy-min-rows", type=rows_or_auto, default=None, metavar="ROWS",
                   help="on CUDA, from how many rows a step multiplies the quantised layers' "
                        "dense copies (--prefill-dense-weights) instead of their codes: a "
                        "row count, or auto = timed at start for each layer shape on this "
                        "GPU, the copy from the row count where it wins (default: 65)")
    p.add_argument("--cpu-aot-kernels", default="auto", choices=CPU_AOT_MODES,
                   help="one-token CPU steps through code compiled ahead of time, kept in the "
                        "weights cache (the int8 LM head's GEMV, the quantised layers' work "
                        "between attention calls): auto = where built (make model; python -m "
                        "backend.engine.build_kernels), build = compile what is missing at "
                        "start (10-40 s once), off = eager (default: %(default)s)")
    p.add_argument("--cpu-int4-activations", default="int8x2", choices=CPU_INT4_ACTIVATIONS,
                   help="int4 layers' calls of few rows (decode steps) on the CPU: int8x2 / "
                        "int8 = the activations rounded per block of 32 to int8 twice (~15 "
                        "bits, torch's kernel's accuracy) or once (+1.5%% perplexity, faster), "
                        "multiplied with the codes by integer dot products (AVX-512 VNNI, or "
                        "AVX2; a C++ op built with the kernels of --cpu-aot-kernels, not with "
                        "off; other CPUs keep torch's kernel): 8-13%% faster decode steps at "
                        "batch 1-8 with VNNI; with AVX2 alone auto keeps a file's int4 codes "
                        "only where the op is built; "
                        "model = torch's int4 kernel (default: %(default)s)")
    p.add_argument("--kv-cache-memory", type=float, default=None, metavar="GiB",
                   help="KV cache size in GiB (default: sized from free memory)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--no-prefix-caching", action="store_true",
                   help="turn off prefix caching over full KV blocks")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True,
                   help="capture decode steps in CUDA graphs (no-op on CPU)")
    p.add_argument("--cuda-graph-max-tokens", type=int, default=2048, metavar="N",
                   help="also capture steps carrying up to N prefill tokens (prompts, and "
                        "prompt chunks beside decodes; triton attention), in token buckets "
                        "up to the prefill budget; 0: decode steps only "
                        "(default: %(default)s)")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="torch.compile the work between attention calls (default: off; "
                        "on CUDA the fused Triton kernels measured faster)")
    p.add_argument("--fused-ops", action=argparse.BooleanOptionalAction, default=None,
                   help="fused Triton kernels for norm, RoPE and SiLU when not compiled "
                        "(default: on CUDA only)")
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="prepare step N+1 while the GPU runs step N (default: on CUDA only)")
    p.add_argument("--max-prefill-tokens", type=int, default=None,
                   help=f"prefill tokens one step may carry (default: "
                        f"{DEFAULT_MAX_PREFILL_TOKENS}, or --max-num-batched-tokens when smaller)")
    p.add_argument("--prefill-priority", action="store_true",
                   help="prefill waiting prompts before the running decodes' next token")
    p.add_argument("--nvtx", action="store_true", help="emit NVTX ranges")
    p.add_argument("--nvtx-prefix", default="infer", help="prefix of NVTX range names")
    p.add_argument("--enable-profiling", action="store_true",
                   help="serve POST /debug/profile {\"steps\": N}: profile the next N engine "
                        f"steps (bearer token from the env var {PROFILE_TOKEN_ENV}, required)")
    p.add_argument("--profile-dir", default="runs/profiles",
                   help="where /debug/profile stores its traces (default: %(default)s)")
    p.add_argument("--header-timeout", type=float, default=10.0, metavar="S",
                   help="close a connection whose request head takes longer (slow clients)")
    p.add_argument("--body-timeout", type=float, default=60.0, metavar="S",
                   help="answer 408 when a request body takes longer to arrive")
    p.add_argument("--keepalive-timeout", type=float, default=30.0, metavar="S",
                   help="close an idle keep-alive connection after this long")
    p.add_argument("--max-connections", type=int, default=2048,
                   help="open connections past this get a 503 and are closed")
    p.add_argument("--log-level", default="INFO")
    return p


def config_from_args(args: argparse.Namespace) -> ServerConfig:
    engine = EngineConfig(
        device=args.device, dtype=args.dtype, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, scheduling=args.scheduling,
        attention=args.attention, kv_cache_dtype=args.kv_cache_dtype,
        weights_dtype=args.weights_dtype, int4_group_size=args.int4_group_size,
        lm_head_dtype=args.lm_head_dtype, weights_scaling=args.weights_scaling,
        prefill_dense_weights=args.prefill_dense_weights,
        prefill_dense_max_gib=args.prefill_dense_max_gib,
        gpu_copy_min_rows=args.gpu_copy_min_rows, cpu_aot_kernels=args.cpu_aot_kernels,
        cpu_int4_activations=args.cpu_int4_activations,
        kv_cache_memory_gib=args.kv_cache_memory, block_size=args.block_size,
        cuda_graph=args.cuda_graph, cuda_graph_max_tokens=args.cuda_graph_max_tokens,
        nvtx=args.nvtx, nvtx_prefix=args.nvtx_prefix,
        max_model_len=args.max_model_len, enable_prefix_caching=not args.no_prefix_caching,
        compile=args.compile, fused_ops=args.fused_ops, async_scheduling=args.async_scheduling,
        max_prefill_tokens=args.max_prefill_tokens, prefill_priority=args.prefill_priority)
    return ServerConfig(model=args.model, host=args.host, port=args.port,
                        served_model_name=args.served_model_name, engine=engine,
                        enable_profiling=args.enable_profiling, profile_dir=args.profile_dir,
                        header_timeout_s=args.header_timeout, body_timeout_s=args.body_timeout,
                        keepalive_timeout_s=args.keepalive_timeout,
                        max_connections=args.max_connections)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ValidationError as exc:  # config validation: a usage error, not a traceback
        parser.error(describe(exc))
    if config.enable_profiling and not os.environ.get(PROFILE_TOKEN_ENV):
        parser.error(f"--enable-profiling needs a bearer token in the env var "
                     f"{PROFILE_TOKEN_ENV}; refusing to start with an open profiling route")
    import uvloop

    from backend.server.app import serve

    try:
        uvloop.run(serve(config))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
