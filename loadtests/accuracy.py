"""Accuracy of the load generator: reported minus injected TTFT, at several user counts.

    flock /tmp/ft-heavy.lock python -m loadtests.accuracy --users 1,16,64,256 \\
        --json docs/benchmarks/loadgen-accuracy.json

The fake upstream (its own process, uvloop) injects TTFT ``--ttft-ms`` and ITL ``--itl-ms``;
Locust runs ``loadtests/chat.py`` closed-loop with N users straight against it. The error of a
request is ``ttft_s - ttft_ms/1000``; it includes the fake's own lateness (timer granularity,
its event loop under load), so a reference client — one blocking raw socket, one stream at a
time — measures that floor first. Each row carries the generator's saturation verdict.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from urllib.parse import urlsplit

from loadtests.records import read_records, summary_path
from loadtests.stats import summarize

CHAT_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat.py")


def start_fake(ttft_ms: float, itl_ms: float, tokens: int) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "loadtests.fake_upstream", "--port", "0",
                             "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
                             "--tokens", str(tokens)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # "listening http://127.0.0.1:PORT", flushed first
    if not line.startswith("listening "):
        proc.kill()
        raise RuntimeError(f"fake upstream did not start: {line!r}")
    return proc, line.split()[1]


def reference_errors(url: str, n: int, ttft_ms: float, tokens: int,
                     stop: threading.Event | None = None) -> list[float]:
    """TTFT error seen by the simplest possible client: a blocking socket, one request.

    With ``stop`` it runs (up to ``n`` requests) until set: a probe of how late the fake
    upstream itself is while Locust loads it.
    """
    u = urlsplit(url)
    body = json.dumps({"model": "m", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "x"}]}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    errs: list[float] = []
    for _ in range(n):
        if stop is not None and stop.is_set():
            break
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            t0 = time.perf_counter_ns()
            s.sendall(head + body)
            buf = b""
            while b'"content":"t0' not in buf:
                chunk = s.recv(65536)
                if not chunk:
                    raise RuntimeError("reference stream ended before content")
                buf += chunk
            errs.append((time.perf_counter_ns() - t0) / 1e9 - ttft_ms / 1000)
    return errs


def load_args(users: int, mode: str, a: argparse.Namespace) -> list[str]:
    """Locust arguments for ``users`` concurrent streams.

    lockstep: closed loop, all users start together and, with a constant service time, stay
    in step — every first token of a wave arrives at once (the worst case for client and
    fake). open: constant arrivals at 0.9 x users / service time over a pool of ``users``,
    so about 0.9 x users streams are in flight, evenly interleaved like independent clients.
    """
    if mode == "lockstep":
        return ["-u", str(users), "-r", str(users)]
    service_s = (a.ttft_ms + a.itl_ms * (a.tokens - 1)) / 1000
    rate = 0.9 * users / service_s
    return ["-u", str(users), "-r", str(users), "--arrival", "constant", "--rate", f"{rate:.3f}"]


def run_users(url: str, users: int, requests: int, out_dir: str, a: argparse.Namespace,
              mode: str, fake_pid: int) -> dict:
    import psutil
    records = os.path.join(out_dir, f"{mode}-users-{users:03d}.jsonl")
    cmd = [sys.executable, "-m", "locust", "-f", CHAT_PY, "--headless", "--only-summary",
           *load_args(users, mode, a), "-t", f"{a.step_timeout}s", "--host", url,
           "--model", "fake", "--prompt-tokens", "16", "--output-tokens", str(a.tokens),
           "--warmup-requests", str(2 * users), "--measure-requests", str(requests),
           "--records", records, "--stop-timeout", "5"]
    t0 = time.time()
    fake_proc = psutil.Process(fake_pid)
    fake_proc.cpu_percent(None)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stop = threading.Event()
    probe: list[float] = []
    # The probe starts once Locust is up (about a second) and runs until the step ends.
    thread = threading.Thread(target=lambda: (stop.wait(1.5),
                                              probe.extend(reference_errors(
                                                  url, 100_000, a.ttft_ms, a.tokens, stop))),
                              daemon=True)
    thread.start()
    try:
        rc = proc.wait(a.step_timeout + 120)
    finally:
        stop.set()
        if proc.poll() is None:
            proc.kill()
        thread.join(30)
    fake_cpu = fake_proc.cpu_percent(None)  # mean over the step, % of one core
    recs = [r for r in read_records(records) if r.phase == "measure"]
    ok = [r for r in recs if r.ok]
    err = summarize((r.ttft_s or 0) - a.ttft_ms / 1000 for r in ok)
    with open(summary_path(records)) as f:
        gen = json.load(f)["generator"]
    return {
        "mode": mode, "users": users, "locust_args": load_args(users, mode, a),
        "locust_exit_code": rc,
        # error after the response headers: removes the fake's own request-handling delay
        # (bursts of new requests queue in it before its 100 ms timer even starts)
        "error_after_headers_ms": summarize(
            ((r.ttft_s or 0) - (r.ttfb_s or 0) - a.ttft_ms / 1000) * 1000 for r in ok).to_dict(),
        "queue_ms_p99": summarize(r.queue_s * 1000 for r in recs).p99,
        "measured": len(recs), "fake_upstream_cpu_pct": fake_cpu,
        "probe_error_ms": summarize(e * 1000 for e in probe).to_dict(),
        "ok": len(ok), "wall_s": round(time.time() - t0, 1),
        "error_ms": {k: (v * 1000 if isinstance(v, float) else v)
                     for k, v in err.to_dict().items() if k not in ("count", "p99_reliable")},
        "error_count": err.count,
        "abs_error_p50_ms": summarize(abs((r.ttft_s or 0) - a.ttft_ms / 1000) * 1000
                                      for r in ok).p50,
        "abs_error_p99_ms": summarize(abs((r.ttft_s or 0) - a.ttft_ms / 1000) * 1000
                                      for r in ok).p99,
        "generator_saturated": gen["saturated"], "generator_reasons": gen["reasons"],
        "timing_noise": gen.get("timing_noise", []),
        "generator_gc_pauses_ms": gen.get("gc_pauses_ms"),
        "generator_cpu_p90_pct": gen["cpu_pct"]["p90"],
        "loop_lag_p99_ms": gen["loop_lag_ms"]["p99"],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtests.accuracy", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--users", default="1,16,64,256")
    p.add_argument("--requests", default="120,400,1000,3000",
                   help="measured requests per user count (same order as --users)")
    p.add_argument("--ttft-ms", type=float, default=100.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--tokens", type=int, default=64, help="content tokens per stream")
    p.add_argument("--reference-requests", type=int, default=50)
    p.add_argument("--mode", default="both", choices=("open", "lockstep", "both"),
                   help="how users start (see spawn_rate); default both")
    p.add_argument("--step-timeout", type=int, default=300)
    p.add_argument("--out", default="runs/accuracy")
    p.add_argument("--json", default=None, help="write the results here too")
    a = p.parse_args(argv)
    users = [int(x) for x in a.users.split(",")]
    reqs = [int(x) for x in a.requests.split(",")]
    os.makedirs(a.out, exist_ok=True)
    fake, url = start_fake(a.ttft_ms, a.itl_ms, a.tokens)
    try:
        ref = summarize(e * 1000 for e in reference_errors(url, a.reference_requests,
                                                            a.ttft_ms, a.tokens))
        modes = ("open", "lockstep") if a.mode == "both" else (a.mode,)
        rows = [run_users(url, u, reqs[min(i, len(reqs) - 1)], a.out, a, mode, fake.pid)
                for mode in modes for i, u in enumerate(users)]
    finally:
        fake.terminate()
        fake.wait(10)
    result = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{os.cpu_count()}-core {platform.machine()}, Python "
                         f"{platform.python_version()}",
              "load_average": os.getloadavg(), "injected": {"ttft_ms": a.ttft_ms,
                                                            "itl_ms": a.itl_ms,
                                                            "tokens": a.tokens},
              "reference_client_error_ms": ref.to_dict(), "rows": rows}
    text = json.dumps(result, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    print(f"reference raw-socket client: error {ref.fmt('ms', 1.0)}")
    print("| load | users | n | error p50 ms | error p99 ms | abs p99 ms | after-headers p50/p99 "
          "| probe p50/p99 ms (n) | fake CPU % | gen CPU p90 % | loop lag p99 ms | saturated |")
    for r in rows:
        e = {k: (math.nan if v is None else v) for k, v in r["error_ms"].items()}
        pr = {k: (math.nan if v is None else v) for k, v in r["probe_error_ms"].items()}
        ah = r["error_after_headers_ms"]
        print(f"| {r['mode']} | {r['users']} | {r['error_count']} | {e['p50']:.2f} | "
              f"{e['p99']:.2f} | {r['abs_error_p99_ms']:.2f} | "
              f"{ah['p50'] if ah['p50'] is not None else math.nan:.2f}/"
              f"{ah['p99'] if ah['p99'] is not None else math.nan:.2f} | "
              f"{pr['p50']:.2f}/{pr['p99']:.2f} ({pr['count']}) | "
              f"{r['fake_upstream_cpu_pct']:.0f} | {r['generator_cpu_p90_pct'] or math.nan:.0f} | "
              f"{r['loop_lag_p99_ms'] or math.nan:.1f} | {r['generator_saturated']} "
              f"{'; '.join(r['generator_reasons'])} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
