"""Replay a fixed workload through the backend's engine, for Nsight (not live traffic).

The usual pitfall: a 30 s capture of a server under live traffic makes requests time
out, and no two captures see the same work. This drives `backend.engine.llm_engine.LLMEngine`
in this process with fixed prompts (seeded token ids, or a JSONL file), greedy decoding and a
forced output length, keeping `--concurrency` requests in flight (closed loop) until
`--requests` are done. Warm-up requests (and CUDA-graph capture) run first, outside the
capture; the measured part runs inside one NVTX range, `<prefix>:replay`, which
`nsys_profile.sh` uses as its capture range (`--capture-range=nvtx`). The engine's own NVTX
ranges (`<prefix>:schedule|prefill|decode|sample`, domain `<prefix>`) are on (`--nvtx`), so
the timeline shows them inside the capture. Everything runs on one thread, so push/pop NVTX
ranges also work for `ncu --nvtx-include`.

    python deploy/nsight/replay.py --model smollm2-135m-instruct --device cuda \
        --requests 64 --concurrency 8 --prompt-tokens 512 --output-tokens 128

Prints one JSON line: requests, tokens, seconds, steps, output tokens/s.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct",
                   help="as `python -m backend --model` (synthetic:<preset> works too)")
    p.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"))
    p.add_argument("--requests", type=int, default=64, help="measured requests (default 64)")
    p.add_argument("--concurrency", type=int, default=8, help="requests kept in flight")
    p.add_argument("--warmup", type=int, default=8, help="requests before the capture range")
    p.add_argument("--prompt-tokens", type=int, default=512, help="seeded prompts of this length")
    p.add_argument("--output-tokens", type=int, default=128, help="forced (ignore_eos) length")
    p.add_argument("--prompts", type=Path, default=None,
                   help="JSONL of {\"prompt\": text} or {\"prompt_token_ids\": [...]} (cycled)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--attention", default="sdpa", choices=("sdpa", "math"))
    p.add_argument("--kv-cache-dtype", default="auto", choices=("auto", "int8", "fp8_e4m3"))
    p.add_argument("--kv-cache-memory", type=float, default=None, metavar="GiB")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--nvtx-prefix", default="infer",
                   help="prefix (and domain) of the engine's NVTX ranges; the capture range is "
                        "<prefix>:replay in the default domain")
    p.add_argument("--max-steps", type=int, default=1_000_000, help="safety bound on steps")
    a = p.parse_args(argv)
    for name in ("requests", "concurrency", "prompt_tokens", "output_tokens"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if a.warmup < 0:
        p.error("--warmup must be >= 0")
    return a


def fixed_prompts(a: argparse.Namespace, tokenizer, vocab_size: int, count: int) -> list[list[int]]:
    """The same prompts on every run: seeded token ids, or the JSONL file's prompts."""
    if a.prompts is not None:
        rows = [json.loads(line) for line in a.prompts.read_text(encoding="utf-8").splitlines()
                if line.strip()]
        if not rows:
            raise SystemExit(f"replay.py: {a.prompts} has no prompts")
        ids = [r["prompt_token_ids"] if "prompt_token_ids" in r else tokenizer.encode(r["prompt"])
               for r in rows]
        return [list(ids[i % len(ids)]) for i in range(count)]
    rng = random.Random(a.seed)
    # Skip the low ids, where byte-level and special tokens live.
    lo = min(256, vocab_size // 2)
    return [[rng.randrange(lo, vocab_size) for _ in range(a.prompt_tokens)] for _ in range(count)]


def run_closed_loop(engine, prompts: list[list[int]], params, concurrency: int, tag: str,
                    max_steps: int) -> tuple[int, int]:
    """Keeps `concurrency` requests in flight until all are done; returns (steps, tokens)."""
    pending = list(enumerate(prompts))
    live: set[str] = set()
    steps = tokens = 0
    while pending or live:
        while pending and len(live) < concurrency:
            i, ids = pending.pop(0)
            rid = f"{tag}-{i}"
            engine.add_request(rid, ids, params)
            live.add(rid)
        if steps >= max_steps:
            raise SystemExit(f"replay.py: {tag} not done after {max_steps} steps")
        for out in engine.step():
            tokens += len(out.new_token_ids)
            if out.finished:
                live.discard(out.request_id)
        steps += 1
    return steps, tokens


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    import torch

    from backend.engine.config import EngineConfig
    from backend.engine.llm_engine import LLMEngine
    from backend.engine.sampling import SamplingParams
    from backend.weights.loader import load_model_source

    source = load_model_source(a.model)
    config = EngineConfig(
        device=a.device, dtype=a.dtype, max_num_seqs=a.max_num_seqs,
        max_num_batched_tokens=a.max_num_batched_tokens, attention=a.attention,
        kv_cache_dtype=a.kv_cache_dtype, kv_cache_memory_gib=a.kv_cache_memory,
        cuda_graph=a.cuda_graph, nvtx=True, nvtx_prefix=a.nvtx_prefix)
    engine = LLMEngine(config, source)
    params = SamplingParams(max_tokens=a.output_tokens, min_tokens=a.output_tokens,
                            ignore_eos=True, temperature=0.0, seed=a.seed)
    prompts = fixed_prompts(a, source.tokenizer, source.config.vocab_size, a.warmup + a.requests)
    cuda = a.device.startswith("cuda")
    if a.warmup:
        run_closed_loop(engine, prompts[:a.warmup], params, a.concurrency, "warmup", a.max_steps)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push(f"{a.nvtx_prefix}:replay")
    t0 = time.perf_counter()
    steps, tokens = run_closed_loop(engine, prompts[a.warmup:], params, a.concurrency,
                                    "replay", a.max_steps)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    if cuda:
        torch.cuda.nvtx.range_pop()
    print(json.dumps({
        "model": source.name, "device": a.device, "requests": a.requests,
        "concurrency": a.concurrency, "prompt_tokens": sum(len(p) for p in prompts[a.warmup:]),
        "output_tokens": tokens, "steps": steps, "seconds": round(seconds, 6),
        "output_tokens_per_s": round(tokens / seconds, 3) if seconds > 0 else None,
        "nvtx_capture_range": f"{a.nvtx_prefix}:replay"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
