"""Speed on this CPU: our backend (HTTP, streaming, client-side timing) vs transformers generate.

Three figures for the same model, prompts and token counts, in one run:
  * TTFT of a prompt of exactly N tokens (default 512; a fresh prompt each repetition, so the
    backend's prefix cache never helps),
  * decode tok/s at batch 1 = (completion_tokens - 1) / (t_last_token - t_first_token),
  * aggregate tok/s with C concurrent requests (default 8) = all generated tokens / wall time
    from the first request sent to the last token received; transformers runs the same 8
    prompts as one left-padded batched ``generate``.
Output lengths are forced (backend: ignore_eos; transformers: min_new_tokens).

    flock /tmp/ft-heavy.lock .venv/bin/python -m loadtests.bench_backend_cpu \
        --out docs/benchmarks/backend-cpu.json
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import aiohttp

WORDS = ("river mountain quiet engine paper window silver market garden planet signal "
         "winter harbor pencil forest kitchen bridge lantern coffee circle thunder valley "
         "rocket meadow copper island orange velvet castle shadow").split()


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def build_prompts(tokenizer: object, args: argparse.Namespace) -> dict:
    """Token-id prompts shared by both sides: exact-length long ones, short chat ones."""
    rng = random.Random(0)
    long = []
    for i in range(args.reps + 1):  # +1: warm-up
        ids = tokenizer.encode(f"Document {i}. " + _text(rng, args.prompt_tokens * 2))
        long.append(ids[:args.prompt_tokens])
    chat = []
    for i in range(args.concurrency + 1):
        msg = f"Story {i}: write a long story about " + _text(rng, 10 + 8 * i)
        text = tokenizer.apply_chat_template([{"role": "user", "content": msg}])
        chat.append(tokenizer.encode(text))
    return {"long": long, "chat": chat}


# --- our backend, through HTTP -------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _stream(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    """One streamed completion: send time, content-chunk times, usage."""
    t0 = time.perf_counter()
    stamps, usage, server = [], None, None
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            server = chunk.get("firsttoken_timings") or server
            if any(c.get("text") for c in chunk.get("choices", [])):
                stamps.append(time.perf_counter())
    return {"t0": t0, "stamps": stamps, "completion_tokens": usage["completion_tokens"],
            "server": server}


def _body(model: str, prompt: list[int], max_tokens: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


async def _backend_runs(base: str, model: str, prompts: dict, args: argparse.Namespace) -> dict:
    url = f"{base}/v1/completions"
    timeout = aiohttp.ClientTimeout(total=1800)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        await _stream(s, url, _body(model, prompts["long"][-1], 4))  # warm-up
        await _stream(s, url, _body(model, prompts["chat"][-1], 8))
        ttft, server_ttft = [], []
        for prompt in prompts["long"][:-1]:
            r = await _stream(s, url, _body(model, prompt, 1))
            ttft.append(r["stamps"][0] - r["t0"])
            server_ttft.append(r["server"])  # the backend's own split of the same request
        decode = []
        for prompt in prompts["chat"][:args.reps]:
            r = await _stream(s, url, _body(model, prompt, args.decode_tokens))
            decode.append((r["completion_tokens"] - 1) / (r["stamps"][-1] - r["stamps"][0]))
        batch = []
        for _ in range(args.reps):
            t0 = time.perf_counter()
            rs = await asyncio.gather(*(_stream(s, url, _body(model, p, args.decode_tokens))
                                        for p in prompts["chat"][:args.concurrency]))
            wall = max(r["stamps"][-1] for r in rs) - t0
            batch.append(sum(r["completion_tokens"] for r in rs) / wall)
    return {"ttft_s": ttft, "decode_tok_s": decode, "aggregate_tok_s": batch,
            "server_timings_of_ttft_requests": server_ttft}


def run_backend(prompts: dict, args: argparse.Namespace) -> dict:
    port = _free_port()
    cmd = [sys.executable, "-m", "backend", "--model", args.model, "--port", str(port),
           "--log-level", "WARNING", *args.backend_args.split()]
    proc = subprocess.Popen(cmd)
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_health(base, proc, timeout=900)
        health = json.loads(_get(f"{base}/health"))
        model = json.loads(_get(f"{base}/v1/models"))["data"][0]["id"]
        load_before = _load()
        out = asyncio.run(_backend_runs(base, model, prompts, args))
        out.update(command=" ".join(cmd[1:]), attention_kernel=health["attention_kernel"],
                   load_before=load_before, load_after=_load())
        return out
    finally:
        proc.terminate()
        proc.wait(60)


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def _wait_health(base: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"backend exited with {proc.returncode}")
        try:
            _get(f"{base}/health")
            return
        except OSError:
            time.sleep(0.5)
    raise TimeoutError("backend did not become healthy")


# --- transformers --------------------------------------------------------------------------
def _hf_model(args: argparse.Namespace) -> object:
    import torch
    from transformers import AutoModelForCausalLM

    from backend.weights.embedded import find_or_fetch

    gguf = Path(find_or_fetch())
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                 dtype=torch.float32)
    return model.eval()


class _Stamps:
    """A transformers streamer that timestamps every generate step (prompt first)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: object) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def run_transformers(prompts: dict, args: argparse.Namespace) -> dict:
    import torch
    import transformers

    torch.set_num_threads(os.cpu_count() or 1)
    model = _hf_model(args)
    pad = model.config.eos_token_id if isinstance(model.config.eos_token_id, int) else 0

    def generate(batch: list[list[int]], n: int, streamer: object = None) -> object:
        width = max(len(p) for p in batch)  # left padding, as batched generation requires
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                  min_new_tokens=n, do_sample=False, pad_token_id=pad,
                                  streamer=streamer)

    load_before = _load()
    generate([prompts["long"][-1]], 2)
    generate([prompts["chat"][-1]], 8)  # warm-up
    ttft = []
    for prompt in prompts["long"][:-1]:
        t0 = time.perf_counter()
        generate([prompt], 1)
        ttft.append(time.perf_counter() - t0)
    decode = []
    for prompt in prompts["chat"][:args.reps]:
        st = _Stamps()
        generate([prompt], args.decode_tokens, st)
        steps = st.times[1:]  # the first put() is the prompt
        decode.append((len(steps) - 1) / (steps[-1] - steps[0]))
    batch = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        out = generate(prompts["chat"][:args.concurrency], args.decode_tokens)
        wall = time.perf_counter() - t0
        width = max(len(p) for p in prompts["chat"][:args.concurrency])
        batch.append((out.shape[1] - width) * out.shape[0] / wall)
    return {"ttft_s": ttft, "decode_tok_s": decode, "aggregate_tok_s": batch,
            "transformers": transformers.__version__, "load_before": load_before,
            "load_after": _load()}


# --- report --------------------------------------------------------------------------------
def _summary(side: dict) -> dict:
    return {"ttft_s_median": statistics.median(side["ttft_s"]),
            "decode_tok_s_median": statistics.median(side["decode_tok_s"]),
            "aggregate_tok_s_median": statistics.median(side["aggregate_tok_s"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--backend-args", default="", help="extra flags for python -m backend")
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--out", default="docs/benchmarks/backend-cpu.json")
    args = p.parse_args(argv)
    from backend.weights.loader import load_model_source

    prompts = build_prompts(load_model_source(args.model).tokenizer, args)
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "python": platform.python_version(),
              "args": vars(args), "backend": run_backend(prompts, args)}
    if not args.skip_transformers:
        result["transformers"] = run_transformers(prompts, args)
    result["summary"] = {k: _summary(v) for k, v in result.items()
                         if k in ("backend", "transformers")}
    if "transformers" in result:
        b, t = result["summary"]["backend"], result["summary"]["transformers"]
        result["summary"]["ratio_backend_over_transformers"] = {
            "ttft_speedup": t["ttft_s_median"] / b["ttft_s_median"],
            "decode_batch1": b["decode_tok_s_median"] / t["decode_tok_s_median"],
            f"aggregate_{args.concurrency}": b["aggregate_tok_s_median"]
            / t["aggregate_tok_s_median"]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
