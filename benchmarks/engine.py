"""Engine-level CPU benchmark against transformers ``generate`` in the same run.

    python -m benchmarks.engine [--model smollm2-135m-instruct] [--json PATH]

Measures, for our engine (LLMEngine driven directly, no HTTP) and for transformers
(``AutoModelForCausalLM`` from the same weights, fp32, ``generate`` with greedy decoding):
- TTFT of a 512-token prompt (prefill + first token), median of --repeats;
- decode tokens/s at batch 1 (128 tokens after a short prompt, TTFT excluded);
- aggregate tokens/s with 8 concurrent requests of 128 tokens: ours through continuous
  batching; transformers both as one batch of 8 through ``generate`` (equal-length prompts,
  no padding) and one request after another (what a server around ``generate`` without a
  batcher does with 8 concurrent requests).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

from backend.engine._tools import emit_json
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams


def _prompt(n: int, seed: int, vocab: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, min(vocab, 20000), (n,), generator=g).tolist()


def bench_ours(source, args, dtype: str) -> dict:
    engine = LLMEngine(EngineConfig(kv_cache_memory_gib=1.0, max_model_len=2048, dtype=dtype,
                                    enable_prefix_caching=False), source)
    vocab = source.config.vocab_size
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    engine.generate([_prompt(32, 0, vocab)], one)  # warm-up
    ttft = []
    for r in range(args.repeats):
        t = time.perf_counter()
        engine.generate([_prompt(512, 100 + r, vocab)], one)
        ttft.append(time.perf_counter() - t)
    n = args.tokens
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    engine.add_request("b1", _prompt(16, 1, vocab), params)
    engine.step()  # prefill + first token
    t = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    decode = (n - 1) / (time.perf_counter() - t)
    prompts = [_prompt(16 + 4 * i, 10 + i, vocab) for i in range(8)]
    t = time.perf_counter()
    outs = engine.generate(prompts, params)
    agg = sum(map(len, outs)) / (time.perf_counter() - t)
    stats = engine.stats()
    return {"ttft_512_s": statistics.median(ttft), "ttft_512_all_s": ttft,
            "decode_tok_s_batch1": decode, "aggregate_tok_s_8": agg,
            "attention_kernel": stats.attention_kernel, "dtype": stats.dtype}


def bench_transformers(source, args, dtype: str) -> dict:
    import transformers
    from backend.weights import embedded

    gguf = embedded.find_or_fetch()
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype)).eval()
    vocab = source.config.vocab_size
    kw = dict(do_sample=False, pad_token_id=0, eos_token_id=None)

    def gen(batch: list[list[int]], n: int) -> None:
        ids = torch.tensor(batch)
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,
                       min_new_tokens=n, **kw)

    with torch.inference_mode():
        gen([_prompt(32, 0, vocab)], 1)
        ttft = []
        for r in range(args.repeats):
            t = time.perf_counter()
            gen([_prompt(512, 100 + r, vocab)], 1)
            ttft.append(time.perf_counter() - t)
        n = args.tokens
        t = time.perf_counter()
        gen([_prompt(16, 1, vocab)], 1)
        first = time.perf_counter() - t
        t = time.perf_counter()
        gen([_prompt(16, 1, vocab)], n)
        decode = (n - 1) / (time.perf_counter() - t - first)
        # one padded batch: equal-length prompts so no padding skews it in HF's favour
        t = time.perf_counter()
        gen([_prompt(28, 10 + i, vocab) for i in range(8)], n)
        agg = 8 * n / (time.perf_counter() - t)
        # a server around generate() without batching serves 8 concurrent requests one by one
        t = time.perf_counter()
        for i in range(8):
            gen([_prompt(28, 10 + i, vocab)], n)
        seq = 8 * n / (time.perf_counter() - t)
    return {"ttft_512_s": statistics.median(ttft), "ttft_512_all_s": ttft,
            "decode_tok_s_batch1": decode, "aggregate_tok_s_8": agg,
            "aggregate_tok_s_8_one_by_one": seq, "dtype": dtype}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--dtypes", default="auto,float32", help="our engine's dtypes to run")
    ap.add_argument("--hf-dtypes", default="float32", help="transformers dtypes ('' = skip)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    from backend.weights.loader import load_model_source

    source = load_model_source(args.model)
    result = {"model": source.name, "date": time.strftime("%Y-%m-%d %H:%M"),
              "machine": f"{os.cpu_count()}-core {platform.machine()}, torch {torch.__version__}",
              "threads": torch.get_num_threads(), "load_before": os.getloadavg(),
              "ours": {d: bench_ours(source, args, d) for d in args.dtypes.split(",") if d},
              "transformers": {d: bench_transformers(source, args, d)
                               for d in args.hf_dtypes.split(",") if d}}
    result["load_after"] = os.getloadavg()
    emit_json(result, args.json)


if __name__ == "__main__":
    main()
