"""Speed on this CPU: our backend (HTTP, streaming, client-side timing) vs transformers generate.

Three figures for the same model, prompts and token counts, in one run:
  * TTFT of a prompt of exactly N tokens (default 512; a fresh prompt each repetition, so the
    backend's prefix cache never helps),
  * decode tok/s at batch 1 = (completion_tokens - 1) / (t_last_token - t_first_token),
  * aggregate tok/s with C concurrent requests (default 8) = all generated tokens / wall time
    from the first request sent to the last token received; transformers runs the same 8
    prompts as one left-padded batched ``generate``.
Output lengths are forced (backend: ignore_eos; transformers: min_new_tokens). The two sides
alternate repetition by repetition (the idle side uses no CPU), so load from other work on the
machine hits both alike. Medians are reported next to every raw sample in the JSON.
The JSON also keeps what the backend's /health said about its weights and kernels, the
server's resident memory (VmRSS, and the peak VmHWM) after start-up and at the end, the
seconds from spawning it to a healthy /health, and its first request (a short chat prompt,
16 tokens) before any warm-up: what the first user after a start feels
(``--first-request-only`` measures just that and stops).

    flock /tmp/ft-heavy.lock .venv/bin/python -m benchmarks.backend_cpu \
        --out docs/benchmarks/backend-cpu.json
"""
from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Callable

import aiohttp

from loadtests.procs import free_port, stop_process
from openai_stream import SSEFramer, has_content, is_done

WORDS = ("river mountain quiet engine paper window silver market garden planet signal "
         "winter harbor pencil forest kitchen bridge lantern coffee circle thunder valley "
         "rocket meadow copper island orange velvet castle shadow").split()


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _rss_mib(pid: int) -> dict[str, float]:
    """The server's resident memory now (VmRSS: RssAnon + RssFile, the mapped files) and at
    its peak (VmHWM), MiB (Linux)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
                    out[key] = round(int(value.split()[0]) / 1024, 1)  # kB -> MiB
    except OSError:
        pass
    return out


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def build_prompts(tokenizer: object, args: argparse.Namespace) -> dict:
    """Token-id prompts shared by both sides: exact-length long ones, short chat ones."""
    rng = random.Random(0)
    long = []
    for i in range(args.reps + 1):  # +1: warm-up
        ids = tokenizer.encode(f"Document {i}. " + _text(rng, args.prompt_tokens * 2))
        long.append(ids[:args.prompt_tokens])
    chat = []  # the first `concurrency` go out together; decode takes one per repetition
    for i in range(max(args.concurrency, args.reps) + 1):
        msg = f"Story {i}: write a long story about " + _text(rng, 10 + 8 * i)
        text = tokenizer.apply_chat_template([{"role": "user", "content": msg}])
        chat.append(tokenizer.encode(text))
    return {"long": long, "chat": chat}


# --- our backend, through HTTP -------------------------------------------------------------
def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def start_backend(args: argparse.Namespace) -> tuple[subprocess.Popen, str, list[str]]:
    """``python -m backend`` on a free loopback port; returns once /health answers."""
    port = free_port()
    cmd = [sys.executable, "-m", "backend", "--model", args.model, "--port", str(port),
           "--log-level", "WARNING", *args.backend_args.split()]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"backend exited with {proc.returncode}")
        try:
            _get(f"{base}/health")
            return proc, base, cmd
        except OSError:
            time.sleep(0.5)
    stop_process(proc, grace_s=0)
    raise TimeoutError("backend did not become healthy in 900 s")


async def _stream(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    """One streamed completion: send time, content-chunk times, usage, server timings.
    A server that sends no usage (llama.cpp's) counts one token per content chunk."""
    t0 = time.perf_counter()
    stamps, usage, server = [], None, None
    framer = SSEFramer()
    async with session.post(url, json=body) as resp:
        resp.raise_for_status()
        while data := await resp.content.readany():
            t = time.perf_counter()
            for event, _ in framer.feed(data):
                if event is None or is_done(event):
                    continue
                chunk = json.loads(event)
                usage = chunk.get("usage") or usage
                server = chunk.get("firsttoken_timings") or server
                if has_content(chunk.get("choices")):
                    stamps.append(t)
    tokens = usage["completion_tokens"] if usage else len(stamps)
    return {"t0": t0, "stamps": stamps, "completion_tokens": tokens, "server": server}


def _body(model: str, prompt: list[int] | str, max_tokens: int) -> dict:
    return {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}


class BackendSide:
    """Client-side measurements against the running backend (streamed completions).
    ``as_text``: send prompts as text (a peer server that takes no token ids)."""

    def __init__(self, session: aiohttp.ClientSession, base: str, model: str,
                 as_text: Callable[[list[int]], str] | None = None) -> None:
        self.session, self.url, self.model = session, f"{base}/v1/completions", model
        self.server_ttft: list[dict] = []
        self.as_text = as_text

    def _body(self, prompt: list[int], max_tokens: int) -> dict:
        return _body(self.model, self.as_text(prompt) if self.as_text else prompt, max_tokens)

    async def ttft(self, prompt: list[int]) -> float:
        r = await _stream(self.session, self.url, self._body(prompt, 1))
        self.server_ttft.append(r["server"])  # the backend's own split of the same request
        return r["stamps"][0] - r["t0"]

    async def first_request(self, prompt: list[int], n: int) -> dict:
        """TTFT, end to end and the longest gap between content chunks of one request."""
        r = await _stream(self.session, self.url, self._body(prompt, n))
        st = r["stamps"]
        return {"ttft_s": st[0] - r["t0"], "e2e_s": st[-1] - r["t0"],
                "max_gap_s": max((b - a for a, b in zip(st, st[1:])), default=0.0),
                "completion_tokens": r["completion_tokens"]}

    async def decode(self, prompt: list[int], n: int) -> float:
        r = await _stream(self.session, self.url, self._body(prompt, n))
        return (r["completion_tokens"] - 1) / (r["stamps"][-1] - r["stamps"][0])

    async def aggregate(self, prompts: list[list[int]], n: int) -> float:
        t0 = time.perf_counter()
        rs = await asyncio.gather(*(_stream(self.session, self.url, self._body(p, n))
                                    for p in prompts))
        return sum(r["completion_tokens"] for r in rs) / (max(r["stamps"][-1] for r in rs) - t0)


# --- transformers --------------------------------------------------------------------------
class _Stamps:
    """A transformers streamer that timestamps every generate step (prompt first)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: object) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


class TransformersSide:
    """The same measurements with transformers ``generate`` (fp32, from the same GGUF)."""

    def __init__(self) -> None:
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        from backend.weights.embedded import find_or_fetch

        torch.set_num_threads(os.cpu_count() or 1)
        gguf = Path(find_or_fetch())
        self.torch, self.version = torch, transformers.__version__
        self.model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32).eval()
        eos = self.model.config.eos_token_id
        self.pad = eos if isinstance(eos, int) else 0

    def generate(self, batch: list[list[int]], n: int, streamer: object = None) -> object:
        torch, pad = self.torch, self.pad
        width = max(len(p) for p in batch)  # left padding, as batched generation requires
        ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch])
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])
        with torch.inference_mode():
            return self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                                       min_new_tokens=n, do_sample=False, pad_token_id=pad,
                                       streamer=streamer)

    def ttft(self, prompt: list[int]) -> float:
        t0 = time.perf_counter()
        self.generate([prompt], 1)
        return time.perf_counter() - t0

    def decode(self, prompt: list[int], n: int) -> float:
        st = _Stamps()
        self.generate([prompt], n, st)
        steps = st.times[1:]  # the first put() is the prompt
        return (len(steps) - 1) / (steps[-1] - steps[0])

    def aggregate(self, prompts: list[list[int]], n: int) -> float:
        t0 = time.perf_counter()
        out = self.generate(prompts, n)
        wall = time.perf_counter() - t0
        return (out.shape[1] - max(len(p) for p in prompts)) * out.shape[0] / wall


# --- the run -------------------------------------------------------------------------------
async def measure(base: str, model: str, hf: TransformersSide | None, prompts: dict,
                  args: argparse.Namespace,
                  as_text: Callable[[list[int]], str] | None = None,
                  peer: tuple[str, str, Callable[[list[int]], str]] | None = None) -> dict:
    """Both sides, alternating repetition by repetition: transformers (``hf``), or a running
    peer server (``peer`` = (base URL, model, token ids -> its text prompt)), or neither."""
    other = "peer" if peer else "transformers"
    out: dict = {"backend": {}, other: {}, "load": {}}
    chat, n, c = prompts["chat"], args.decode_tokens, args.concurrency
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as session:
        be = BackendSide(session, base, model, as_text)
        out["first_request"] = await be.first_request(chat[-1], 16)
        if args.first_request_only:
            del out[other]
            return out
        side = hf
        if peer:
            side = BackendSide(session, *peer)
            out["peer_first_request"] = await side.first_request(chat[-1], 16)
        await be.aggregate(chat[-1:] * 2, 8)  # warm-up (the engine's first steps are slow)
        await be.ttft(prompts["long"][-1])
        be.server_ttft.clear()
        if hf:
            hf.generate([prompts["long"][-1]], 2)
            hf.generate(chat[-1:] * 2, 8)
        elif side:
            await side.aggregate(chat[-1:] * 2, 8)
            await side.ttft(prompts["long"][-1])

        async def pair(metric: str, call: Callable, i: int) -> None:
            """One repetition of each side; a peer server goes first in every other one
            (whatever a request leaves running afterwards falls on both sides alike)."""
            order = [("backend", be), (other, side)] if side else [("backend", be)]
            for name, s in order[::-1] if peer and i % 2 else order:
                value = call(s)
                value = await value if inspect.isawaitable(value) else value
                out[name].setdefault(metric, []).append(value)

        for i in range(args.reps):
            await pair("ttft_s", lambda s: s.ttft(prompts["long"][i]), i)  # noqa: B023
        out["load"]["after_ttft"] = _load()
        for i in range(args.reps):
            await pair("decode_tok_s", lambda s: s.decode(chat[i], n), i)  # noqa: B023
        out["load"]["after_decode"] = _load()
        for i in range(args.reps):
            await pair("aggregate_tok_s", lambda s: s.aggregate(chat[:c], n), i)
        out["load"]["after_aggregate"] = _load()
        out["backend"]["server_timings_of_ttft_requests"] = be.server_ttft
    if not side:
        del out[other]
    return out


def _summary(side: dict) -> dict:
    return {f"{k}_median": statistics.median(side[k])
            for k in ("ttft_s", "decode_tok_s", "aggregate_tok_s")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--backend-args", default="", help="extra flags for python -m backend")
    p.add_argument("--skip-transformers", action="store_true")
    p.add_argument("--peer-url", default=None,
                   help="measure this running OpenAI-compatible server (e.g. llama.cpp's) "
                        "instead of starting ours; prompts go as text")
    p.add_argument("--paired", action="store_true",
                   help="with --peer-url: start ours too and alternate with the peer request "
                        "by request (transformers skipped), so both see the same machine; "
                        "the summary gives our ratio over the peer, pair by pair too")
    p.add_argument("--first-request-only", action="store_true",
                   help="start the server, time its first request, stop (no transformers)")
    p.add_argument("--out", default="docs/benchmarks/backend-cpu.json")
    args = p.parse_args(argv)
    from backend.weights.loader import load_model_source

    tokenizer = load_model_source(args.model).tokenizer
    prompts = build_prompts(tokenizer, args)
    result = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": platform.platform(),
              "cpus": os.cpu_count(), "python": platform.python_version(),
              "args": vars(args), "load_start": _load()}
    peer = None
    if args.peer_url:
        peer = (args.peer_url, json.loads(_get(f"{args.peer_url}/v1/models"))["data"][0]["id"],
                tokenizer.decode)
    if args.peer_url and not args.paired:
        model = peer[1]
        result.update(asyncio.run(measure(args.peer_url, model, None, prompts, args,
                                          tokenizer.decode)))
        result["load_end"] = _load()
        result["peer"] = result.pop("backend")
        if args.first_request_only:
            return _finish(result, args.out, result["first_request"])
        result["summary"] = {"peer": _summary(result["peer"])}
        return _finish(result, args.out, result["summary"])
    spawned = time.perf_counter()
    proc, base, _ = start_backend(args)
    start_s = time.perf_counter() - spawned
    try:
        health = json.loads(_get(f"{base}/health"))
        rss_start = _rss_mib(proc.pid)
        model = json.loads(_get(f"{base}/v1/models"))["data"][0]["id"]
        hf = None if (args.skip_transformers or args.first_request_only or peer) \
            else TransformersSide()
        result.update(asyncio.run(measure(base, model, hf, prompts, args, peer=peer)))
        result["backend"].update(command=f"python -m backend --model {args.model} "
                                         f"{args.backend_args}".strip(),
                                 attention_kernel=health["attention_kernel"], dtype=health.get("dtype"),
                                 weights_dtype=health.get("weights_dtype"),
                                 linear_kernel=health.get("linear_kernel"),
                                 lm_head_dtype=health.get("lm_head_dtype"),
                                 lm_head_kernel=health.get("lm_head_kernel"),
                                 prefill_kernel=health.get("prefill_kernel"),
                                 prefill_dense_weights=health.get("prefill_dense_weights"),
                                 cpu_aot_kernels=health.get("cpu_aot_kernels"),
                                 server_rss_mib={"after_start": rss_start,
                                                 "end": _rss_mib(proc.pid)},
                                 start_s=start_s)
        if hf:
            result["transformers"]["version"] = hf.version
    finally:
        stop_process(proc, grace_s=60)
    result["load_end"] = _load()
    if args.first_request_only:
        return _finish(result, args.out, {"start_s": start_s, **result["first_request"]})
    result["summary"] = {k: _summary(result[k]) for k in ("backend", "transformers", "peer")
                         if k in result}
    if "peer" in result:
        b, q = result["backend"], result["peer"]
        result["summary"]["backend_over_peer"] = {
            metric: {"median": statistics.median(ratios), "pairs": ratios}
            for metric, ratios in (
                ("ttft_speedup", [y / x for x, y in zip(b["ttft_s"], q["ttft_s"])]),
                ("decode_batch1", [x / y for x, y in zip(b["decode_tok_s"], q["decode_tok_s"])]),
                (f"aggregate_{args.concurrency}",
                 [x / y for x, y in zip(b["aggregate_tok_s"], q["aggregate_tok_s"])]))}
    if "transformers" in result:
        b, t = result["summary"]["backend"], result["summary"]["transformers"]
        result["summary"]["backend_over_transformers"] = {
            "ttft_speedup": t["ttft_s_median"] / b["ttft_s_median"],
            "decode_batch1": b["decode_tok_s_median"] / t["decode_tok_s_median"],
            f"aggregate_{args.concurrency}": b["aggregate_tok_s_median"]
            / t["aggregate_tok_s_median"]}
    return _finish(result, args.out, result["summary"])


def _finish(result: dict, out: str, shown: dict) -> int:
    """Writes the whole result to ``out`` and prints ``shown``."""
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(result, indent=1))
    print(json.dumps(shown, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
