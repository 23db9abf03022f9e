"""Accuracy of the load generator: reported minus injected TTFT, at several user counts.

    flock /tmp/ft-heavy.lock python -m benchmarks.loadgen_accuracy --users 1,16,64,256 \\
        --json docs/benchmarks/loadgen-accuracy.json

The fake upstream (its own process, uvloop, ``--precise-timers`` unless ``--loop-timers``)
injects TTFT ``--ttft-ms`` and ITL ``--itl-ms``; Locust runs ``loadtests/chat.py`` with N users
straight against it. Two errors per request:

- vs injected: ``ttft_s - ttft_ms/1000``; it includes the fake's own
  lateness (timer, its event loop under a burst of requests);
- vs sent (the generator's own error): ``ttft_s - (first content sent - request start)``, with
  the fake's send time from its ``--stamp-log`` (CLOCK_REALTIME, matched by ``x-request-id`` to
  ``RequestRecord.t_start_unix``), i.e. loopback delivery + the generator's own delay.

A reference client — one blocking raw socket, one stream at a time — measures the fake's floor
first and, as a probe, while Locust loads the fake. Each row carries the saturation verdict.
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

import httptools

from loadtests.procs import stop_process
from loadtests.records import read_records, summary_path
from loadtests.stats import summarize
from openai_stream import SSEFramer, has_content, is_done

CHAT_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat.py")


def start_fake(ttft_ms: float, itl_ms: float, tokens: int,
               extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "fakeupstream", "--port", "0",
                             "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms),
                             "--tokens", str(tokens), *extra], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # "listening http://127.0.0.1:PORT", flushed first
    if not line.startswith("listening "):
        stop_process(proc, grace_s=0)
        raise RuntimeError(f"fake upstream did not start: {line!r}")
    return proc, line.split()[1]


def reference_errors(url: str, n: int, ttft_ms: float, tokens: int,
                     stop: threading.Event | None = None) -> list[dict[str, float]]:
    """TTFT errors (ms) seen by the simplest possible client: a blocking socket, one request.

    Each sample: ``injected`` (TTFT - ttft_ms) and, when the fake stamps chunks, ``vs_sent``
    (receipt - the fake's ``fake_sent_ns``: loopback delivery + this client) and ``fake_late``
    (``fake_sent_ns - fake_recv_ns - ttft``: the fake's own timer lateness). With ``stop`` it
    runs (up to ``n`` requests) until set: a probe of the fake while Locust loads it.
    """
    u = urlsplit(url)
    body = json.dumps({"model": "m", "stream": True, "max_tokens": tokens,
                       "messages": [{"role": "user", "content": "x"}],
                       "fake": {"stamp": True}}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.netloc}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode()
    out: list[dict[str, float]] = []
    for _ in range(n):
        if stop is not None and stop.is_set():
            break
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            t0 = time.perf_counter_ns()  # CLOCK_MONOTONIC, the fake's stamp clock too
            s.sendall(head + body)
            first = _first_content_event(s)
            t1 = time.perf_counter_ns()
        out.append(_reference_sample(first, t0, t1, ttft_ms))
    return out


class _FirstContent:
    """httptools callbacks: frames the body as SSE and keeps the first content-bearing event."""

    def __init__(self) -> None:
        self.framer = SSEFramer()
        self.event: dict | None = None

    def on_body(self, body: bytes) -> None:
        for data, _ in self.framer.feed(body):
            if data is None or self.event is not None or is_done(data):
                continue
            obj = json.loads(data)
            if isinstance(obj, dict) and has_content(obj.get("choices")):
                self.event = obj


def _first_content_event(s: socket.socket) -> dict:
    """Read one response until its first content-bearing event is complete; that event."""
    sink = _FirstContent()
    parser = httptools.HttpResponseParser(sink)
    while sink.event is None:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError("reference stream ended before content")
        parser.feed_data(chunk)
    return sink.event


def _reference_sample(event: dict, t0: int, t1: int, ttft_ms: float) -> dict[str, float]:
    sample = {"injected": (t1 - t0) / 1e6 - ttft_ms}
    recv, sent = event.get("fake_recv_ns"), event.get("fake_sent_ns")
    if recv and sent:
        sample["vs_sent"] = (t1 - sent) / 1e6
        sample["fake_late"] = (sent - recv) / 1e6 - ttft_ms
    return sample


def _ms(samples: list[dict[str, float]], key: str) -> dict:
    return summarize(x[key] for x in samples if key in x).to_dict()


def read_stamps(path: str) -> dict[str, dict]:
    """The fake's ``--stamp-log``: request id -> its line (first send and receipt times)."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return {d["request_id"]: d for d in map(json.loads, filter(str.strip, f))}


def wire_errors(ok: list, stamps: dict[str, dict], ttft_ms: float) -> dict:
    """Generator error vs the fake's actual first send, and the fake's own lateness (ms)."""
    vs_sent, fake_late_client, fake_late_recv = [], [], []
    for r in ok:
        st = stamps.get(r.request_id)
        if st is None or r.ttft_s is None:
            continue
        true_ttft_s = st["first_sent_unix_ns"] / 1e9 - r.t_start_unix
        vs_sent.append((r.ttft_s - true_ttft_s) * 1000)
        fake_late_client.append(true_ttft_s * 1000 - ttft_ms)
        fake_late_recv.append((st["first_sent_ns"] - st["recv_ns"]) / 1e6 - ttft_ms)
    return {"error_vs_sent_ms": summarize(vs_sent).to_dict(),
            "fake_late_from_client_start_ms": summarize(fake_late_client).to_dict(),
            "fake_late_from_fake_receipt_ms": summarize(fake_late_recv).to_dict()}


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
              mode: str, fake_pid: int, stamp_log: str) -> dict:
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
    probe: list[dict[str, float]] = []
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
        stop_process(proc, grace_s=0)
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
        "probe_error_ms": _ms(probe, "injected"),
        "probe_error_vs_sent_ms": _ms(probe, "vs_sent"),
        "probe_fake_late_ms": _ms(probe, "fake_late"),
        **wire_errors(ok, read_stamps(stamp_log), a.ttft_ms),
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
    p = argparse.ArgumentParser(prog="python -m benchmarks.loadgen_accuracy", description=__doc__,
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
    p.add_argument("--loop-timers", action="store_true",
                   help="run the fake without --precise-timers (the earlier, ~1 ms late fake)")
    p.add_argument("--fake-loop", choices=("uvloop", "asyncio"), default="uvloop")
    p.add_argument("--fake-args", default="",
                   help="more fake upstream flags, e.g. '--finish-us 0 --itl-grid-us 0'")
    p.add_argument("--out", default="runs/accuracy")
    p.add_argument("--json", default=None, help="write the results here too")
    a = p.parse_args(argv)
    users = [int(x) for x in a.users.split(",")]
    reqs = [int(x) for x in a.requests.split(",")]
    os.makedirs(a.out, exist_ok=True)
    stamp_log = os.path.join(a.out, "fake-stamps.jsonl")
    if os.path.exists(stamp_log):
        os.remove(stamp_log)
    extra = ("--stamp-log", stamp_log, "--loop", a.fake_loop,
             *(() if a.loop_timers else ("--precise-timers",)), *a.fake_args.split())
    fake, url = start_fake(a.ttft_ms, a.itl_ms, a.tokens, extra)
    try:
        ref_samples = reference_errors(url, a.reference_requests, a.ttft_ms, a.tokens)
        ref = summarize(x["injected"] for x in ref_samples)
        modes = ("open", "lockstep") if a.mode == "both" else (a.mode,)
        rows = [run_users(url, u, reqs[min(i, len(reqs) - 1)], a.out, a, mode, fake.pid,
                          stamp_log)
                for mode in modes for i, u in enumerate(users)]
    finally:
        stop_process(fake, grace_s=10)
    result = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "machine": f"{os.cpu_count()}-core {platform.machine()}, Python "
                         f"{platform.python_version()}",
              "load_average": os.getloadavg(), "injected": {"ttft_ms": a.ttft_ms,
                                                            "itl_ms": a.itl_ms,
                                                            "tokens": a.tokens},
              "fake": {"precise_timers": not a.loop_timers, "loop": a.fake_loop,
                       "args": a.fake_args},
              "reference_client_error_ms": ref.to_dict(),
              "reference_client_error_vs_sent_ms": _ms(ref_samples, "vs_sent"),
              "reference_client_fake_late_ms": _ms(ref_samples, "fake_late"),
              "rows": rows}
    text = json.dumps(result, indent=2)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    _print_table(result)
    return 0


def _f(d: dict, key: str) -> str:
    v = d.get(key)
    return "nan" if v is None else f"{v:.2f}"


def _print_table(result: dict) -> None:
    ref_vs = result["reference_client_error_vs_sent_ms"]
    ref_late = result["reference_client_fake_late_ms"]
    print(f"fake: {result['fake']}; reference raw-socket client: error vs injected p50/p99 "
          f"{_f(result['reference_client_error_ms'], 'p50')}/"
          f"{_f(result['reference_client_error_ms'], 'p99')} ms, vs sent "
          f"{_f(ref_vs, 'p50')}/{_f(ref_vs, 'p99')}, fake late {_f(ref_late, 'p50')}/"
          f"{_f(ref_late, 'p99')} (n={ref_vs['count']})")
    print("| load | users | n | vs injected p50 / p99 | \\|vs injected\\| p50 / p99 | "
          "vs sent p50 / p99 (n) | fake late from client start p50 / p99 | fake late from "
          "receipt p50 / p99 | probe vs injected p50 / p99 (n) | probe vs sent p50 / p99 | "
          "fake CPU % | gen CPU p90 % | loop lag p99 | saturated |")
    for r in result["rows"]:
        e, vs = r["error_ms"], r["error_vs_sent_ms"]
        lc, lr = r["fake_late_from_client_start_ms"], r["fake_late_from_fake_receipt_ms"]
        pr, pvs = r["probe_error_ms"], r["probe_error_vs_sent_ms"]
        print(f"| {r['mode']} | {r['users']} | {r['error_count']} | {_f(e, 'p50')} / "
              f"{_f(e, 'p99')} | {_f(r, 'abs_error_p50_ms')} / {_f(r, 'abs_error_p99_ms')} | "
              f"{_f(vs, 'p50')} / {_f(vs, 'p99')} ({vs['count']}) | {_f(lc, 'p50')} / "
              f"{_f(lc, 'p99')} | {_f(lr, 'p50')} / {_f(lr, 'p99')} | {_f(pr, 'p50')} / "
              f"{_f(pr, 'p99')} ({pr['count']}) | {_f(pvs, 'p50')} / {_f(pvs, 'p99')} | "
              f"{r['fake_upstream_cpu_pct']:.0f} | {r['generator_cpu_p90_pct'] or math.nan:.0f} "
              f"| {r['loop_lag_p99_ms'] or math.nan:.1f} | {r['generator_saturated']} "
              f"{'; '.join(r['generator_reasons'] + r['timing_noise'])} |")


if __name__ == "__main__":
    sys.exit(main())
