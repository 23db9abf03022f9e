"""A one-process TTFT benchmark with a CSV history you can compare.

    python -m loadtests.bench_ttft --host http://127.0.0.1:8080 --model smollm2 --label baseline
    python -m loadtests.bench_ttft --compare --csv runs/bench_ttft.csv

What a naive TTFT script gets wrong and this one does not: it counted SSE lines as tokens (role
chunk, usage chunk and ``[DONE]`` included) — we take ``usage.completion_tokens``; it stopped
TTFT at the first line even without content — we stop at the first content-bearing delta; it
called the maximum of 20 samples "p99" — we print every percentile with its sample count and
mark a p99 from fewer than 100 samples; it had no warm-up in code — we run ``--warmup-runs``
first and drop them. Each run appends one labelled row to ``--csv`` (after three
changes nobody remembers which one helped); ``--compare`` charts that history.
"""
from __future__ import annotations

import argparse
import csv
import os
import sys
import time
import tomllib

from loadtests.client import StreamingChatClient
from loadtests.prompts import PromptFactory, ServerTokenCounter, default_tokenize_url
from loadtests.settings import read_profiling
from loadtests.sse import RequestRecord
from loadtests.stats import summarize

FIELDS = ("label", "time_utc", "host", "model", "prompt_tokens", "output_tokens", "concurrency",
          "warmup_runs", "measured", "failed", "ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms",
          "tpot_p50_ms", "tpot_p95_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms",
          "output_tok_s", "tokens_source", "p99_reliable", "prompt_tokens_seen")


def _one(client: StreamingChatClient, prompts: PromptFactory, a: argparse.Namespace) -> RequestRecord:
    body = {"model": a.model, "messages": prompts.messages(), "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": a.output_tokens,
            "temperature": 0, "min_tokens": a.output_tokens, "ignore_eos": True}
    return client.stream_chat(body, a.model)


def run(a: argparse.Namespace) -> dict:
    import gevent
    import gevent.pool
    counter = ServerTokenCounter(a.tokenize_url or default_tokenize_url(a.host), a.model,
                                 a.api_key)
    try:
        prompts = PromptFactory(counter, a.prompt_tokens, chat=True, seed=a.seed)
    finally:
        counter.close()
    clients = [StreamingChatClient(a.host, a.api_key, timeout_s=a.timeout)
               for _ in range(a.concurrency)]
    pool = gevent.pool.Pool(a.concurrency)

    def batch(n: int) -> list[RequestRecord]:
        jobs = [pool.spawn(_one, clients[i % a.concurrency], prompts, a) for i in range(n)]
        gevent.joinall(jobs)
        return [j.value for j in jobs]

    batch(a.warmup_runs)  # dropped: first requests pay for caches, lazy init, connections
    t0 = time.time()
    recs = batch(a.measure_runs)
    wall = time.time() - t0
    for c in clients:
        c.close()
    ok = [r for r in recs if r.ok]
    ttft, tpot, e2e = (summarize(r.ttft_s for r in ok), summarize(r.tpot_s for r in ok),
                       summarize(r.e2e_s for r in ok))
    sources = sorted({r.tokens_source for r in ok})
    ms = lambda v: round(v * 1000, 3) if v == v else None  # noqa: E731  (NaN -> None)
    return {
        "label": a.label, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": a.host, "model": a.model, "prompt_tokens": a.prompt_tokens,
        "output_tokens": a.output_tokens, "concurrency": a.concurrency,
        "warmup_runs": a.warmup_runs, "measured": len(ok), "failed": len(recs) - len(ok),
        "ttft_p50_ms": ms(ttft.p50), "ttft_p95_ms": ms(ttft.p95), "ttft_p99_ms": ms(ttft.p99),
        "tpot_p50_ms": ms(tpot.p50), "tpot_p95_ms": ms(tpot.p95), "tpot_p99_ms": ms(tpot.p99),
        "e2e_p50_ms": ms(e2e.p50), "e2e_p99_ms": ms(e2e.p99),
        "output_tok_s": round(sum(r.completion_tokens or 0 for r in ok) / wall, 2),
        "tokens_source": "+".join(sources) or "none", "p99_reliable": ttft.p99_reliable,
        "prompt_tokens_seen": summarize(r.prompt_tokens for r in ok).p50,
        "_errors": sorted({r.error for r in recs if not r.ok})[:5], "_ttft": ttft,
        "_tpot": tpot, "_e2e": e2e,
    }


def append_row(path: str, row: dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    new = not os.path.exists(path) or os.path.getsize(path) == 0
    with open(path, "a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
        if new:
            w.writeheader()
        w.writerow(row)


def compare(csv_path: str, png_path: str) -> str:
    """Chart every row of the history: TTFT p50/p99 and TPOT p50 per labelled run."""
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{csv_path}: no rows")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels = [f"{r['label'] or '?'}\n{r['time_utc'][5:16]}" for r in rows]
    num = lambda r, k: float(r[k]) if r.get(k) not in (None, "") else float("nan")  # noqa: E731
    fig, axes = plt.subplots(1, 2, figsize=(max(8, 1.4 * len(rows) + 4), 4.4))
    x = range(len(rows))
    axes[0].bar([i - 0.2 for i in x], [num(r, "ttft_p50_ms") for r in rows], 0.4, label="p50")
    axes[0].bar([i + 0.2 for i in x], [num(r, "ttft_p99_ms") for r in rows], 0.4, label="p99")
    axes[0].set_title("TTFT per run (n = measured requests)")
    axes[0].set_ylabel("ms")
    for i, r in enumerate(rows):
        axes[0].annotate(f"n={r['measured']}", (i, num(r, "ttft_p50_ms")), ha="center",
                         textcoords="offset points", xytext=(0, 3), fontsize=7)
    axes[1].bar(list(x), [num(r, "tpot_p50_ms") for r in rows], 0.5, color="purple")
    axes[1].set_title("TPOT p50 per run")
    axes[1].set_ylabel("ms/token")
    for ax in axes:
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=8)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)
    for r in rows:
        print(f"{r['label']:>20} {r['time_utc']}  TTFT p50 {r['ttft_p50_ms']} ms  p99 "
              f"{r['ttft_p99_ms']} ms  TPOT p50 {r['tpot_p50_ms']} ms  n={r['measured']}")
    return png_path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m loadtests.bench_ttft", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", help="base URL, e.g. http://127.0.0.1:8080 (gateway or server)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--label", default="", help="what changed in this run (a CSV column)")
    p.add_argument("--config", help="a config.toml: [profiling] and "
                   "[provider].api_key_env are read")
    p.add_argument("--warmup-runs", type=int, default=None, help="default 5")
    p.add_argument("--measure-runs", type=int, default=None, help="default 20 (>= 100 for p99)")
    p.add_argument("--prompt-tokens", type=int, default=None, help="default 512")
    p.add_argument("--output-tokens", type=int, default=None, help="default 256")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--api-key", default=None, help="default: env GATEWAY_API_KEY")
    p.add_argument("--tokenize-url", default=None, help="default HOST/tokenize")
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--csv", default="runs/bench_ttft.csv", help="history file (appended)")
    p.add_argument("--compare", action="store_true", help="chart the --csv history and exit")
    p.add_argument("--png", default=None, help="--compare chart path (default: CSV.png)")
    a = p.parse_args(argv)
    prof, key_env = {}, "GATEWAY_API_KEY"
    if a.config:
        prof = read_profiling(a.config)
        with open(a.config, "rb") as f:
            key_env = tomllib.load(f).get("provider", {}).get("api_key_env", key_env)
    defaults = {"warmup_runs": prof.get("warmup_requests", 5),
                "measure_runs": prof.get("measure_requests", 20),
                "prompt_tokens": prof.get("prompt_tokens", 512),
                "output_tokens": prof.get("output_tokens", 256)}
    for k, v in defaults.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    a.api_key = a.api_key or os.environ.get(key_env)
    if not a.compare and not a.host:
        p.error("--host is required unless --compare")
    if a.concurrency < 1 or a.measure_runs < 1 or a.warmup_runs < 0:
        p.error("--concurrency and --measure-runs must be >= 1, --warmup-runs >= 0")
    return a


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.compare:
        png = a.png or os.path.splitext(a.csv)[0] + ".png"
        print(f"chart: {compare(a.csv, png)}")
        return 0
    row = run(a)
    append_row(a.csv, row)
    print(f"{a.label or 'run'}: {row['measured']} measured ({row['failed']} failed), "
          f"{a.warmup_runs} warm-up dropped; tokens from {row['tokens_source']}")
    for name in ("_ttft", "_tpot", "_e2e"):
        print(f"  {name[1:].upper():4s} {row[name].fmt()}")
    for err in row["_errors"]:
        print(f"  error: {err}")
    print(f"row appended to {a.csv}")
    return 1 if row["measured"] == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
