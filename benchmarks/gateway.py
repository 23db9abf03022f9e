"""Gateway benchmark: client-observed TTFT/E2E direct vs through the gateway vs through LiteLLM.

    flock /tmp/ft-heavy.lock .venv/bin/python -m benchmarks.gateway run \
        --litellm /tmp/litellm/bin/litellm --out docs/benchmarks

Every server runs in its own process: the fake upstream (``fakeupstream``), the
gateway (``python -m gateway``), LiteLLM's proxy, and the load client (this module's ``client``
sub-command: one uvloop + aiohttp process, closed loop of N concurrent streams). Phases:

* ``latency``: for each concurrency (1, 100, 500) and each target (direct, gateway, litellm):
  a warm-up, then timed streams of 64 tokens; TTFT = request start to the first SSE data line
  with non-empty content; E2E = request start to end of body. Added latency = target - direct.
* ``rss_open``: RSS of the gateway process while 1,000 streams are open at once.
* ``growth``: RSS of the gateway every 10,000 requests over 100,000 short streams.
* ``workers`` (not in the default set): the gateway with 1 and with 2 worker processes
  (``--workers-compare``) in one run: relayed content events/s at full speed, and added TTFT
  at each ``--concurrency`` against direct. ``--workers N`` runs the latency phase with N.

Raw samples' percentiles (with counts) and settings go to ``<out>/gateway-<phase>.json``; a run
with ``--tag T`` (a repeat) appends one line ``{"run": T, ...}`` to
``<out>/gateway-<phase>-repeats.jsonl`` instead, so repeats stay one file per phase.
``--pin`` puts the proxy under test alone on CPU 1 and the fake upstream + client on CPU 0.
``--timers`` picks the fake's delays (``precise``: exact, the default; ``loop``: uvloop's
millisecond ticks); ``--stamp`` splits each TTFT into request and response path from the fake's
send/receipt stamps; ``--samples-dir`` keeps every timed request's timestamps.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks.gateway_client import KEY, client_main, summary
from loadtests.procs import free_port, stop_process
from benchmarks.backend_target import machine


# ---- process helpers --------------------------------------------------------------------------
def _pinned(cpus: set[int] | None) -> Any:
    """preexec_fn that pins the child to ``cpus`` (None: no pinning)."""
    return None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))


def _spawn(cmd: list[str], env: dict[str, str] | None = None,
           cpus: set[int] | None = None) -> tuple[subprocess.Popen, str]:
    """Start a server that prints 'listening URL' first; return (process, url)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                         env={**os.environ, **(env or {})}, preexec_fn=_pinned(cpus))
    line = _readline(p, 60)
    if not line.startswith("listening "):
        stop_process(p, grace_s=0)
        raise RuntimeError(f"{cmd[:4]} did not start: {line!r}")
    return p, line.split()[1]


def _readline(p: subprocess.Popen, timeout: float) -> str:
    import selectors
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)  # type: ignore[arg-type]
    if not sel.select(timeout):
        return ""
    return p.stdout.readline().strip()  # type: ignore[union-attr]


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _client(url: str, model: str, c: int, n: int, warmup: int,
            extra: dict[str, Any] | None = None, timeout: float = 900,
            spread_s: float = 0.0, cpus: set[int] | None = None,
            samples: str | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.gateway", "client", "--url", url,
           "--model", model, "--concurrency", str(c), "--requests", str(n),
           "--warmup", str(warmup), "--body-extra", json.dumps(extra or {}),
           "--spread-s", str(spread_s), *(["--samples", samples] if samples else [])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True,
                         preexec_fn=_pinned(cpus))
    return json.loads(out.stdout.strip().splitlines()[-1])


def _gateway(upstream: str | list[str], tmp: Path, cpus: set[int] | None = None,
             workers: int = 1) -> tuple[subprocess.Popen, str]:
    """The gateway in front of one fake upstream, or of several as deployments of one
    model (least in-flight spreads the streams over them)."""
    ups = [upstream] if isinstance(upstream, str) else upstream
    cfg = {"keys": [{"name": "bench", "env": "BENCH_GATEWAY_KEY"}],
           "providers": {f"fake{i}": {"base_url": u + "/v1", "max_retries": 0}
                         for i, u in enumerate(ups)},
           "models": {"timed": {"deployments": [{"provider": f"fake{i}", "model": "timed"}
                                                for i in range(len(ups))]}},
           "request_log": str(tmp / "gateway-requests.jsonl")}
    path = tmp / "gateway.yaml"
    path.write_text(json.dumps(cfg))
    return _spawn([sys.executable, "-m", "gateway", "--config", str(path), "--port", "0",
                   "--log-level", "WARNING", "--workers", str(workers)],
                  {"BENCH_GATEWAY_KEY": KEY}, cpus)


def _litellm(binary: str, upstream: str, tmp: Path, port: int,
             cpus: set[int] | None = None) -> subprocess.Popen:
    path = tmp / "litellm.yaml"
    path.write_text(json.dumps({"model_list": [{"model_name": "timed", "litellm_params": {
        "model": "openai/timed", "api_base": upstream + "/v1", "api_key": "x"}}]}))
    env = {**os.environ, "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "ERROR"}
    p = subprocess.Popen([binary, "--config", str(path), "--host", "127.0.0.1", "--port",
                          str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         env=env, preexec_fn=_pinned(cpus))
    import urllib.request
    end = time.time() + 180
    while time.time() < end:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=2):
                return p
        except OSError:
            time.sleep(1)
    stop_process(p)
    raise RuntimeError("litellm did not become live in 180 s")



def _meta(a: argparse.Namespace) -> dict[str, Any]:
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine(),
            "loadavg_start": os.getloadavg(), "command": " ".join(sys.argv),
            "pinned": bool(getattr(a, "pin", False)),
            "fake_upstream": {"ttft_ms": a.ttft_ms, "itl_ms": a.itl_ms, "tokens": 64,
                              "stamp": a.stamp, "timers": a.timers}}


def _fake(a: argparse.Namespace, ttft_ms: float, itl_ms: float,
          cpus: set[int] | None = None) -> tuple[subprocess.Popen, str]:
    flags = [f for f, on in (("--stamp", a.stamp), ("--precise-timers", a.timers == "precise"))
             if on]
    return _spawn([sys.executable, "-m", "fakeupstream", "--port", "0",
                   "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--tokens", "64",
                   *flags], cpus=cpus)


# ---- phases -----------------------------------------------------------------------------------
def phase_latency(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    # --pin: the proxy under test gets CPU 1 alone; the fake upstream and the client share
    # CPU 0 (so they never compete with the proxy, as on a machine with a core to spare).
    env_cpus, proxy_cpus = ({0}, {1}) if a.pin else (None, None)
    fake, up = _fake(a, a.ttft_ms, a.itl_ms, env_cpus)
    gw, gw_url = _gateway(up, tmp, proxy_cpus, a.workers)
    procs = {"direct": fake, "gateway": gw}
    urls = {"direct": up, "gateway": gw_url}
    if a.litellm:
        port = free_port()
        procs["litellm"] = _litellm(a.litellm, up, tmp, port, proxy_cpus)
        urls["litellm"] = f"http://127.0.0.1:{port}"
    runs = []
    try:
        for c in [int(x) for x in a.concurrency.split(",")]:
            n = a.requests_1 if c == 1 else max(c * a.rounds, a.min_requests)
            for name, base in urls.items():
                pid, fpid = procs[name].pid, fake.pid
                cpu0, fcpu0 = _cpu_s(pid), _cpu_s(fpid)
                log_rows = _log_len(tmp) if name == "gateway" else 0  # only its log is read
                samples = (str(Path(a.samples_dir) / f"samples{a.tag}-c{c}-{name}.jsonl")
                           if a.samples_dir else None)
                r = _client(base + "/v1/chat/completions", "timed", c, n, max(c, 20),
                            spread_s=(a.ttft_ms + 63 * a.itl_ms) / 1000, cpus=env_cpus,
                            samples=samples)
                if name == "gateway":  # the gateway's own view, warm-up rows skipped
                    r["gateway_log"] = _log_summary(tmp, log_rows + max(c, 20))
                r.update(target=name, server_cpu_s=round(_cpu_s(pid) - cpu0, 2),
                         server_rss_mb=_rss_mb(pid),
                         fake_cpu_s=round(_cpu_s(fpid) - fcpu0, 2) if name != "direct" else None,
                         loadavg=os.getloadavg())
                runs.append(r)
                print(f"[latency] c={c} {name}: ttft p50 {r['ttft']['p50_ms']} p99 "
                      f"{r['ttft']['p99_ms']} ms (n={r['ttft']['n']}), errors {r['errors']}",
                      flush=True)
    finally:
        for p in procs.values():
            stop_process(p)
    return {"runs": runs, "added": _added(runs)}


def _log_len(tmp: Path) -> int:
    path = tmp / "gateway-requests.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _log_summary(tmp: Path, skip: int) -> dict[str, Any]:
    """Percentiles of the gateway's request-log timings (overhead = time it added)."""
    time.sleep(1.5)  # the log is flushed every second
    rows = [json.loads(x) for x in
            (tmp / "gateway-requests.jsonl").read_text().splitlines()[skip:]]
    out: dict[str, Any] = {"rows": len(rows)}
    for k in ("overhead_ttft_s", "overhead_s", "ttft_s", "upstream_ttfb_s"):
        out[k.removesuffix("_s")] = summary([r[k] for r in rows if r[k] is not None])
    return out


def _added(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Target minus direct, per concurrency, for TTFT and E2E p50/p99."""
    out = []
    direct = {r["concurrency"]: r for r in runs if r["target"] == "direct"}
    for r in runs:
        d = direct.get(r["concurrency"])
        if r["target"] == "direct" or d is None:
            continue
        row: dict[str, Any] = {"concurrency": r["concurrency"], "target": r["target"]}
        for metric in ("ttft", "e2e", "request_path", "response_path"):
            if metric not in r or metric not in d:
                continue
            for q in ("p50_ms", "p99_ms"):
                a, b = r[metric][q], d[metric][q]
                row[f"added_{metric}_{q}"] = None if a is None or b is None else round(a - b, 3)
        out.append(row)
    return out


def _tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its children (a gateway's supervisor and workers)."""
    import psutil
    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc, *proc.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _split_cpus(n: int) -> tuple[set[int], set[int]]:
    """The first n usable CPUs for the gateway, the rest for the load (clients, fakes)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) <= n:
        raise SystemExit(f"--workers-pin needs more than {n} CPUs; this machine has {len(cpus)}")
    return set(cpus[:n]), set(cpus[n:])


def _clients(urls: list[str], c: int, n: int, cpus: set[int] | None, tmp: Path,
             warmup: int = 0, spread_s: float = 0.0) -> dict[str, Any]:
    """One client process per URL at once, c/k streams and n/k requests each; streams/s
    summed and TTFT/E2E percentiles from the merged raw samples (one Python client tops out
    near 100,000 events/s and would be the limit itself)."""
    k = len(urls)
    if k == 1:
        return _client(urls[0], "timed", c, n, warmup, spread_s=spread_s, cpus=cpus)
    paths = [str(tmp / f"client-samples-{i}.jsonl") for i in range(k)]
    with ThreadPoolExecutor(k) as pool:
        parts = list(pool.map(lambda i: _client(urls[i], "timed", c // k, n // k, warmup // k,
                                                spread_s=spread_s, cpus=cpus,
                                                samples=paths[i]), range(k)))
    errors: dict[str, int] = {}
    for r in parts:
        for e, count in r["errors"].items():
            errors[e] = errors.get(e, 0) + count
    rows = [json.loads(line) for path in paths for line in Path(path).read_text().splitlines()]
    return {"concurrency": c, "requests": n, "req_per_s": round(sum(r["req_per_s"] for r in parts), 2),
            "errors": errors, "client_procs": k,
            "per_process_req_per_s": [r["req_per_s"] for r in parts],
            "ttft": summary([(r["t_first"] - r["t0"]) / 1e9 for r in rows]),
            "e2e": summary([(r["t_end"] - r["t0"]) / 1e9 for r in rows])}


def phase_workers(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """1 vs 2 gateway workers in one run: relayed content events/s at full speed (TTFT 0,
    ITL 0, 64 tokens, ``--workers-throughput-c`` streams), then client-observed TTFT at each
    ``--concurrency`` through each gateway and direct (added TTFT = gateway - direct)."""
    counts = [int(x) for x in a.workers_compare.split(",")]
    throughput, runs = [], []
    gw_cpus, load_cpus = _split_cpus(max(counts)) if a.workers_pin else (None, None)
    k = a.workers_load_procs
    fakes = [_fake(a, 0, 0, load_cpus) for _ in range(k)]
    try:
        for w in counts:
            gw, url = _gateway([u for _, u in fakes], tmp, gw_cpus, workers=w)
            try:
                _client(url + "/v1/chat/completions", "timed", 50, 200, 0)  # warm up
                cpu0 = _tree_cpu_s(gw.pid)
                r = _clients([url + "/v1/chat/completions"] * k, a.workers_throughput_c,
                             a.workers_throughput_n, load_cpus, tmp)
                r.update(workers=w, content_events_per_s=round(r["req_per_s"] * 64),
                         gateway_cpu_s=round(_tree_cpu_s(gw.pid) - cpu0, 2),
                         load_procs=k, gateway_cpus=sorted(gw_cpus or []))
                throughput.append(r)
                print(f"[workers] {w} worker(s): {r['content_events_per_s']} content events/s "
                      f"({r['req_per_s']} streams/s), gateway CPU {r['gateway_cpu_s']} s, "
                      f"errors {r['errors']}", flush=True)
            finally:
                stop_process(gw)
    finally:
        for p, _ in fakes:
            stop_process(p)
    # Timed streams: with k > 1 the direct run sends each client to its own fake and the
    # gateways spread theirs over the same k fakes (one fake at 500 streams is loaded itself).
    timed = [_fake(a, a.ttft_ms, a.itl_ms, load_cpus) for _ in range(k)]
    ups = [u for _, u in timed]
    gateways = {w: _gateway(ups, tmp, gw_cpus, workers=w) for w in counts}
    try:
        for c in [int(x) for x in a.concurrency.split(",")]:
            n = max(c * a.rounds, a.min_requests)
            targets = [("direct", ups)] + [(f"gateway-{w}w", [g[1]] * k)
                                           for w, g in gateways.items()]
            for name, bases in targets:
                r = _clients([b + "/v1/chat/completions" for b in bases], c, n, load_cpus, tmp,
                             warmup=max(c, 20), spread_s=(a.ttft_ms + 63 * a.itl_ms) / 1000)
                r.update(target=name, loadavg=os.getloadavg())
                runs.append(r)
                print(f"[workers] c={c} {name}: ttft p50 {r['ttft']['p50_ms']} p99 "
                      f"{r['ttft']['p99_ms']} ms (n={r['ttft']['n']}), errors {r['errors']}",
                      flush=True)
    finally:
        for proc, _ in gateways.values():
            stop_process(proc)
        for proc, _ in timed:
            stop_process(proc)
    return {"throughput": throughput, "runs": runs, "added": _added(runs)}


def _metric(url: str, name: str) -> float:
    import urllib.request
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def phase_rss_open(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """Hold ``open_streams`` streams open at once (slow ITL) and watch the gateway's RSS."""
    fake, up = _fake(a, 0, 100)
    gw, gw_url = _gateway(up, tmp)
    n = a.open_streams
    try:
        _client(gw_url + "/v1/chat/completions", "timed", 20, 20, 0,
                {"fake": {"itl_ms": 0}})  # warm the connection pool and code paths
        idle = _rss_mb(gw.pid)
        cmd = [sys.executable, "-m", "benchmarks.gateway", "client", "--url",
               gw_url + "/v1/chat/completions", "--model", "timed", "--concurrency", str(n),
               "--requests", str(n), "--warmup", "0", "--body-extra", "{}"]
        client = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        peak_rss, peak_open, rss_at_peak_open = idle, 0.0, idle
        end = time.time() + 120
        while client.poll() is None and time.time() < end:
            rss = _rss_mb(gw.pid)
            open_now = _metric(gw_url, "gateway_in_flight_requests")
            peak_rss = max(peak_rss, rss)
            if open_now >= peak_open:
                peak_open, rss_at_peak_open = open_now, rss
            time.sleep(0.2)
        out, _ = client.communicate(timeout=120)
        result = json.loads(out.strip().splitlines()[-1])
    finally:
        stop_process(gw)
        stop_process(fake)
    return {"open_streams": n, "stream": "64 tokens, ITL 100 ms (6.4 s each)",
            "idle_rss_mb": idle, "peak_in_flight": peak_open,
            "rss_at_peak_in_flight_mb": rss_at_peak_open, "peak_rss_mb": peak_rss,
            "client": result}


def phase_growth(a: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    """RSS every ``step`` requests over ``growth_requests`` short streams."""
    fake, up = _fake(a, 0, 0)
    gw, gw_url = _gateway(up, tmp)
    extra = {"max_tokens": a.growth_tokens}
    step = a.growth_requests // 10
    points = [{"requests": 0, "rss_mb": _rss_mb(gw.pid)}]
    errors: dict[str, int] = {}
    t0 = time.time()
    try:
        for i in range(1, 11):
            r = _client(gw_url + "/v1/chat/completions", "timed", a.growth_concurrency, step,
                        0, extra)
            for k, v in r["errors"].items():
                errors[k] = errors.get(k, 0) + v
            points.append({"requests": i * step, "rss_mb": _rss_mb(gw.pid),
                           "req_per_s": r["req_per_s"]})
            print(f"[growth] {i * step} requests: RSS {points[-1]['rss_mb']} MB", flush=True)
    finally:
        stop_process(gw)
        stop_process(fake)
    return {"requests": a.growth_requests, "concurrency": a.growth_concurrency,
            "stream": f"{a.growth_tokens} tokens, TTFT 0, ITL 0", "errors": errors,
            "wall_s": round(time.time() - t0, 1), "points": points,
            "growth_after_first_step_mb": round(points[-1]["rss_mb"] - points[1]["rss_mb"], 1)}


def run_main(a: argparse.Namespace) -> None:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.samples_dir:
        Path(a.samples_dir).mkdir(parents=True, exist_ok=True)
    phases = {"latency": phase_latency, "rss_open": phase_rss_open, "growth": phase_growth,
              "workers": phase_workers}
    with tempfile.TemporaryDirectory(prefix="bench-gw-") as tmp:
        for name in a.phases.split(","):
            meta = _meta(a)
            result = phases[name](a, Path(tmp))
            meta["loadavg_end"] = os.getloadavg()
            doc = {"meta": meta, **result}
            if a.tag:
                path = out / f"gateway-{name}-repeats.jsonl"
                with path.open("a", encoding="utf-8") as f:
                    f.write(json.dumps({"run": a.tag.lstrip("-"), **doc}, separators=(",", ":")) + "\n")
            else:
                path = out / f"gateway-{name}.json"
                path.write_text(json.dumps(doc, indent=1) + "\n")
            print(f"wrote {path}", flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gateway", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run the benchmark phases")
    r.add_argument("--out", default="docs/benchmarks")
    r.add_argument("--phases", default="latency,rss_open,growth")
    r.add_argument("--litellm", default=None, help="path to the litellm binary (optional)")
    r.add_argument("--concurrency", default="1,100,500")
    r.add_argument("--pin", action="store_true",
                   help="pin the proxy to CPU 1, fake upstream + client to CPU 0")
    r.add_argument("--tag", default="",
                   help="name of a repeat: appended as a line to gateway-<phase>-repeats.jsonl")
    r.add_argument("--stamp", action="store_true",
                   help="the fake stamps its receipt/send times into each chunk: the TTFT "
                        "splits into request path and response path")
    r.add_argument("--timers", choices=("precise", "loop"), default="precise",
                   help="the fake's delays: precise = timerfd, exact TTFT and ITL on a 0.25 ms "
                        "grid; loop = uvloop timers (1 ms ticks: TTFT 0.1-1.2 ms late and every "
                        "token due in the same ms sent in one burst)")
    r.add_argument("--samples-dir", default=None,
                   help="write every timed request's raw timestamps here (JSONL per run)")
    r.add_argument("--ttft-ms", type=float, default=50.0)
    r.add_argument("--itl-ms", type=float, default=10.0)
    r.add_argument("--requests-1", type=int, default=100, help="timed requests at c=1")
    r.add_argument("--rounds", type=int, default=4, help="timed requests = c x rounds (c>1)")
    r.add_argument("--min-requests", type=int, default=2000,
                   help="at least this many timed requests when c>1: a p99 from 400 samples "
                        "is the 4th largest, and a difference of two such p99s is mostly noise")
    r.add_argument("--workers", type=int, default=1,
                   help="gateway worker processes in the latency phase")
    r.add_argument("--workers-compare", default="1,2",
                   help="worker counts the 'workers' phase compares")
    r.add_argument("--workers-throughput-c", type=int, default=100)
    r.add_argument("--workers-throughput-n", type=int, default=3000)
    r.add_argument("--workers-load-procs", type=int, default=1,
                   help="client processes and fake upstreams (deployments) driving the "
                        "events/s measurement of the 'workers' phase")
    r.add_argument("--workers-pin", action="store_true",
                   help="'workers' phase: the gateway on the first max(--workers-compare) "
                        "CPUs, clients and fakes on the rest")
    r.add_argument("--open-streams", type=int, default=1000)
    r.add_argument("--growth-requests", type=int, default=100_000)
    r.add_argument("--growth-tokens", type=int, default=16)
    r.add_argument("--growth-concurrency", type=int, default=50)
    c = sub.add_parser("client", help="(internal) the load client process")
    c.add_argument("--url", required=True)
    c.add_argument("--model", required=True)
    c.add_argument("--concurrency", type=int, required=True)
    c.add_argument("--requests", type=int, required=True)
    c.add_argument("--warmup", type=int, default=0)
    c.add_argument("--body-extra", default="{}")
    c.add_argument("--spread-s", type=float, default=0.0, help="stagger of worker starts")
    c.add_argument("--samples", default=None, help="raw per-request timestamps (JSONL)")
    a = p.parse_args(argv)
    (run_main if a.cmd == "run" else client_main)(a)


if __name__ == "__main__":
    main()
