"""Benchmark model loading and tokenizer costs for the embedded model.

    python -m benchmarks.weights_load --out docs/benchmarks/weights-load.json [--with-transformers]

Each load runs in a fresh Python process (what a server start pays, imports included):
a cold start converts the GGUF into an empty cache, warm starts hit the cache. Tokenizer
timings (encode of a ~512-token prompt, per-token incremental detokenize) run in-process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_LOAD = ("import time; t=time.perf_counter(); from backend.weights import load_model_source; "
         "s=load_model_source({name!r}); n=sum(t.numel() for _, t in s.weights()); "
         "print(time.perf_counter()-t, n)")
_HF_LOAD = ("import time; t=time.perf_counter(); import torch, transformers; "
            "m=transformers.AutoModelForCausalLM.from_pretrained({dir!r}, gguf_file={file!r}, "
            "dtype=torch.float32); print(time.perf_counter()-t, 0)")


def _run(code: str, env: dict[str, str], timeout: float = 600) -> dict[str, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=timeout, check=True)
    wall = time.perf_counter() - started
    inner, params = proc.stdout.split()[-2:]
    return {"process_wall_s": wall, "in_process_s": float(inner), "params": int(params)}


def bench_loads(name: str, warm_runs: int, with_transformers: bool) -> dict:
    from backend.weights import embedded

    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="ft-bench-cache-") as cache:
        env = dict(os.environ, FIRSTTOKEN_CACHE=cache)
        out["cold_convert"] = _run(_LOAD.format(name=name), env)
        out["warm_cached"] = [_run(_LOAD.format(name=name), env) for _ in range(warm_runs)]
    if with_transformers:
        path = embedded.find_or_fetch()
        out["transformers_gguf_load"] = _run(
            _HF_LOAD.format(dir=str(path.parent), file=path.name), dict(os.environ))
    return out


def bench_tokenizer(name: str, repeats: int) -> dict:
    from backend.weights import load_model_source

    tok = load_model_source(name).tokenizer
    text = (Path(__file__).read_text() * 4)[:2200]
    ids = tok.encode(text)
    encode = []
    for _ in range(repeats):
        t = time.perf_counter()
        tok.encode(text)
        encode.append(time.perf_counter() - t)
    t = time.perf_counter()
    detok = tok.incremental_detokenizer()
    for i in ids:
        detok.push(i)
    per_token = (time.perf_counter() - t) / len(ids)
    return {"prompt_tokens": len(ids), "encode_median_s": statistics.median(encode),
            "encode_samples": repeats, "detokenize_per_token_s": per_token,
            "detokenize_tokens": len(ids)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.weights_load")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--warm-runs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--with-transformers", action="store_true",
                        help="also time transformers' own GGUF load, as the reference")
    parser.add_argument("--out", type=Path, help="write the JSON here")
    args = parser.parse_args(argv)
    result = {
        "model": args.model, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, Python "
                   f"{platform.python_version()}",
        "load_average": os.getloadavg(),  # at the start of the run
        "loads": bench_loads(args.model, args.warm_runs, args.with_transformers),
        "tokenizer": bench_tokenizer(args.model, args.repeats),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
