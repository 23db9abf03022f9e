"""TTFT against batch size: one headless Locust run per batch size, then a report.

    python -m loadtests.sweep --host http://127.0.0.1:8080 --model smollm2 \\
        --batch-sizes 1,2,4,8,16,32 --requests 200 --ttft-slo-ms 500 \\
        --gateway-log runs/requests.jsonl --backend-metrics http://127.0.0.1:8000/metrics

Writes ``<out>/results.csv``, ``results.json``, three PNG charts, ``report.html`` (images
inline) and each step's raw records under ``<out>/steps/``. Every flag: docs/LOADTESTS.md.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from backend.profiling.summary import kernel_busy_pct
from backend.server.config import PROFILE_TOKEN_ENV
from loadtests import observe, report
from loadtests.client import StreamingChatClient
from loadtests.decompose import decompose, read_gateway_log
from loadtests.procs import stop_process
from loadtests.records import read_records, steady_output_rate, summary_path
from loadtests.stats import MIN_SAMPLES_P99, summarize
from loadtests.sweep_backend import BackendProcess

_GATEWAY_LOG_FLUSH_S = 1.5
CHAT_PY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat.py")


@dataclass(frozen=True)
class SweepConfig:
    host: str
    model: str = "smollm2"
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    requests: int = 100
    warmup_requests: int | None = None   # default: the batch size (one per user)
    prompt_tokens: int = 512
    output_tokens: int = 256
    ttft_slo_ms: float | None = None
    slo_percentile: float = 99.0
    out: str = ""
    label: str = ""
    gateway_metrics: str | None = None
    backend_metrics: str | None = None
    metrics_token: str | None = None
    gateway_log: str | None = None
    tokenize_url: str | None = None
    tokenizer: str | None = None
    endpoint: str = "chat"
    seed: int = 0
    step_timeout_s: float = 600.0
    restart_backend: bool = False
    backend_model: str = "smollm2-135m-instruct"
    backend_port: int = 8000
    backend_args: tuple[str, ...] = field(default_factory=tuple)
    # the backend's POST /debug/profile and how many steps to capture there per batch size,
    # once a quarter of the measured requests are done (0: no kernel-busy column)
    profile_url: str | None = None
    profile_steps: int = 0
    profile_token: str | None = field(default=None, repr=False)
    backend_start_timeout_s: float = 600.0
    progress: bool = True
    # The client key: handed to Locust through its environment, never written anywhere.
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.batch_sizes or any(b < 1 for b in self.batch_sizes):
            raise ValueError("--batch-sizes must be positive integers, e.g. 1,2,4,8")
        if self.requests < 1:
            raise ValueError("--requests must be >= 1")
        if not 0 < self.slo_percentile <= 100:
            raise ValueError("--slo-percentile must be in (0, 100]")


def locust_command(cfg: SweepConfig, batch: int, records: str, csv_prefix: str) -> list[str]:
    warmup = batch if cfg.warmup_requests is None else cfg.warmup_requests
    cmd = [sys.executable, "-m", "locust", "-f", CHAT_PY, "--headless", "--only-summary",
           "-u", str(batch), "-r", str(batch), "-t", f"{int(cfg.step_timeout_s)}s",
           "--host", cfg.host, "--model", cfg.model, "--prompt-tokens", str(cfg.prompt_tokens),
           "--output-tokens", str(cfg.output_tokens), "--records", records,
           "--measure-requests", str(cfg.requests), "--warmup-requests", str(warmup),
           "--endpoint", cfg.endpoint, "--csv", csv_prefix, "--stop-timeout", "5",
           "--seed", str(step_seed(cfg, batch))]
    if cfg.tokenize_url:
        cmd += ["--tokenize-url", cfg.tokenize_url]
    if cfg.tokenizer:
        cmd += ["--tokenizer", cfg.tokenizer]
    return cmd


def step_seed(cfg: SweepConfig, batch: int) -> int:
    """The prompt RNG seed of one batch size's step. Each step draws its own prompts: with one
    seed for all, a step would resend the previous step's prompts and a backend that kept
    them in its prefix cache would serve them as cache hits. Keyed by the batch size (not the
    step's position) so a row's prompts do not depend on which other sizes were swept; the
    gap of 1,000 leaves room for Locust's per-worker offsets."""
    return cfg.seed + 1000 * batch


def _count_measured(path: str) -> int:
    try:
        with open(path, "rb") as f:
            return f.read().count(b'"phase":"measure"')
    except OSError:
        return 0


def records_file(step_dir: str) -> str:
    """Where a step's Locust run writes its raw per-request records."""
    return os.path.join(step_dir, "records.jsonl")


def run_locust(cfg: SweepConfig, batch: int, step_dir: str) -> tuple[str, int]:
    """Run one headless Locust step with a progress bar; returns (records path, exit code)."""
    records = records_file(step_dir)
    cmd = locust_command(cfg, batch, records, os.path.join(step_dir, "locust"))
    bar = None
    if cfg.progress:
        from tqdm import tqdm
        bar = tqdm(total=cfg.requests, desc=f"batch {batch:>3}", unit="req", leave=True)
    env = {**os.environ, "GATEWAY_API_KEY": cfg.api_key} if cfg.api_key else None
    with open(os.path.join(step_dir, "locust.log"), "w") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + cfg.step_timeout_s + 60
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
            if bar is not None:
                bar.n = min(_count_measured(records), cfg.requests)
                bar.refresh()
        stop_process(proc, grace_s=0)
    if bar is not None:
        bar.n = min(_count_measured(records), cfg.requests)
        bar.close()
    return records, proc.returncode


def _ms(v: float | None) -> float | None:
    return None if v is None or v != v else v * 1000  # NaN -> None


def _gpm_mean(gpu: dict, name: str) -> float | None:
    """Mean of a GPM series over the step; None when GPM was unavailable (reason in gpu)."""
    gpm = gpu.get("gpm") or {}
    return gpm[name]["mean"] if gpm.get("available") else None


def _loaded_gpu(ok: list, gpu: dict) -> dict:
    """GPU-Util and SM activity over the loaded window: from the first measured request's
    send to the last one's end. The whole-step means above also hold Locust's start-up,
    the warm-up ramp and the drain, when fewer than ``batch`` requests are in flight."""
    spans = [(r.t_start_unix, r.t_start_unix + r.e2e_s) for r in ok
             if r.t_start_unix and r.e2e_s is not None]
    if not spans or not gpu.get("available"):
        return {"gpu_util_loaded_mean_pct": None, "gpu_sm_active_loaded_mean_pct": None,
                "gpu_loaded_window_s": None, "gpu_loaded_samples": 0}
    t0, t1 = min(a for a, _ in spans), max(b for _, b in spans)
    w = observe.window_means(gpu, t0, t1)
    return {"gpu_util_loaded_mean_pct": w["util_pct"],
            "gpu_sm_active_loaded_mean_pct": w["sm_active_pct"],
            "gpu_loaded_window_s": t1 - t0, "gpu_loaded_samples": w["samples"]}


def build_row(cfg: SweepConfig, batch: int, records_path: str, rc: int, gpu: dict,
              metrics: dict | None, gw_log: dict[str, dict]) -> dict:
    """One results row (units in the names) from a step's raw records and observations."""
    recs = read_records(records_path) if os.path.exists(records_path) else []
    try:
        with open(summary_path(records_path)) as f:
            summ = json.load(f)
    except OSError:
        summ = {"generator": {"saturated": None, "reasons": ["no summary written"]},
                "duration_s": None}
    ok = [r for r in recs if r.phase == "measure" and r.ok]
    failed = [r for r in recs if r.phase == "measure" and not r.ok]
    ttft, tpot, e2e = (summarize(r.ttft_s for r in ok), summarize(r.tpot_s for r in ok),
                       summarize(r.e2e_s for r in ok))
    itl = summarize(g for r in ok for g in r.itl_s)
    span = summ.get("duration_s")
    steady = steady_output_rate(recs, cfg.requests)
    slo_s = cfg.ttft_slo_ms / 1000 if cfg.ttft_slo_ms else None
    good = [r for r in ok if slo_s is None or (r.ttft_s or 0) <= slo_s]
    dec = decompose(recs, gw_log)
    gen = summ.get("generator", {})
    errors = Counter(r.error or f"HTTP {r.status}" for r in recs if not r.ok)
    row = {
        "batch_size": batch, "locust_exit_code": rc,
        # a step with no successful request has no latency to report: it is marked, and
        # its most common errors say why (e.g. "HTTP 401: Missing API key")
        "step_failed": not ok,
        "errors": [{"error": e, "count": n} for e, n in errors.most_common(3)],
        "requests_ok": len(ok), "requests_failed": len(failed),
        "ttft_count": ttft.count, "ttft_mean_ms": _ms(ttft.mean), "ttft_p50_ms": _ms(ttft.p50),
        "ttft_p90_ms": _ms(ttft.p90), "ttft_p95_ms": _ms(ttft.p95), "ttft_p99_ms": _ms(ttft.p99),
        "ttft_slo_percentile_ms": _ms(_pct(ok, cfg.slo_percentile)),
        "tpot_count": tpot.count, "tpot_p50_ms": _ms(tpot.p50), "tpot_p99_ms": _ms(tpot.p99),
        "itl_count": itl.count, "itl_p50_ms": _ms(itl.p50), "itl_p99_ms": _ms(itl.p99),
        "e2e_p50_ms": _ms(e2e.p50), "e2e_p99_ms": _ms(e2e.p99),
        "duration_s": span,
        "request_rate": len(ok) / span if span else None,
        "output_tok_s": sum(r.completion_tokens or 0 for r in ok) / span if span else None,
        # the same while all ``batch`` clients were sending (no drain at the end)
        "output_tok_s_steady": steady[0], "steady_window_s": steady[1],
        "goodput_req_s": len(good) / span if span and slo_s else None,
        "goodput_tok_s": (sum(r.completion_tokens or 0 for r in good) / span
                          if span and slo_s else None),
        "slo_attainment": len(good) / len(ok) if ok and slo_s else None,
        "tokens_from_usage": sum(1 for r in ok if r.tokens_source == "usage"),
        # what the server counted (usage), beside whether Locust could fit the length exactly
        "prompt_tokens_p50": summarize(r.prompt_tokens for r in ok
                                       if r.prompt_tokens is not None).p50,
        "prompt_lengths_exact": summ.get("prompt_lengths_exact"),
        # the backend's firsttoken_timings: prompt tokens its prefix cache served
        "cached_prompt_tokens_p50": summarize((r.server_timings or {}).get(
            "cached_prompt_tokens") for r in ok).p50,
        "gpu_available": gpu.get("available", False),
        "gpu_util_mean_pct": (gpu["util_pct"]["mean"] if gpu.get("available") else None),
        "gpu_mem_max_mib": (gpu["mem_used_mib"]["max"] if gpu.get("available") else None),
        "gpu_sm_active_mean_pct": _gpm_mean(gpu, "sm_active_pct"),
        "gpu_tensor_active_mean_pct": _gpm_mean(gpu, "tensor_active_pct"),
        "gpu_dram_bw_mean_pct": _gpm_mean(gpu, "dram_bw_pct"),
        **_loaded_gpu(ok, gpu),
        "generator_saturated": gen.get("saturated"),
        "generator_reasons": "; ".join(gen.get("reasons") or []),
        "timing_noise": "; ".join(gen.get("timing_noise") or []),
        "ttft_decomposition_ms": {k: v * 1000 for k, v in dec["mean_s"].items()},
        "decomposition_joined": {"gateway": dec["joined_gateway"],
                                 "backend": dec["joined_backend"], "requests": dec["requests"]},
        "gateway_means_s": observe.histogram_means(metrics and metrics.get("gateway"),
                                                   "gateway_"),
        "backend_means_s": observe.histogram_means(metrics and metrics.get("backend"),
                                                   "backend_"),
        "gpu": gpu,
    }
    return row


def _pct(ok: list, q: float) -> float | None:
    from loadtests.stats import percentile
    xs = sorted(r.ttft_s for r in ok if r.ttft_s is not None)
    return percentile(xs, q) if xs else None


class LoadedProfile:
    """Asks the backend for a profile of ``cfg.profile_steps`` steps once a quarter of the
    step's measured requests are recorded (under full load, past the warm-up), in a thread;
    ``result()`` gives the kernel-busy columns of the row."""

    def __init__(self, cfg: SweepConfig, records: str) -> None:
        self.cfg, self.records = cfg, records
        self.trigger = max(1, cfg.requests // 4)
        self.report: dict | None = None
        self.error: str | None = "the load ended before the profile was asked for"
        self._stop = threading.Event()
        self.asked = threading.Event()  # set when the request goes out
        self._thread = threading.Thread(target=self._run, name="sweep-profile", daemon=True)

    def start(self) -> "LoadedProfile":
        self._thread.start()
        return self

    def _run(self) -> None:
        while _count_measured(self.records) < self.trigger:
            if self._stop.wait(0.2):
                return  # the load is over: an idle engine would run no step to profile
        self.asked.set()
        body = json.dumps({"steps": self.cfg.profile_steps, "timeout_s": 60}).encode()
        req = urllib.request.Request(self.cfg.profile_url or "", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        if self.cfg.profile_token:
            req.add_header("Authorization", f"Bearer {self.cfg.profile_token}")
        try:
            with urllib.request.urlopen(req, timeout=120) as resp:
                self.report, self.error = json.load(resp), None
        except urllib.error.HTTPError as exc:
            self.error = f"HTTP {exc.code} from {self.cfg.profile_url}: {exc.read()[:200]!r}"
        except (OSError, ValueError) as exc:
            self.error = f"profile request failed: {exc}"

    @staticmethod
    def absent(reason: str) -> dict:
        """The kernel-busy columns of a step without a profile."""
        return {"kernel_busy_pct": None, "kernel_busy_reason": reason,
                "profile_steps_captured": None, "profile_trace": None}

    def result(self, wait_s: float = 90.0) -> dict:
        self._stop.set()
        self._thread.join(wait_s)
        if self.report is None:
            return self.absent(self.error or "no profile report")
        busy, why = kernel_busy_pct(self.report)
        return {"kernel_busy_pct": busy, "kernel_busy_reason": why,
                "profile_steps_captured": (self.report.get("capture") or {}).get(
                    "steps_captured"),
                "profile_trace": self.report.get("trace")}

    def save(self, path: str) -> None:
        """The backend's summary of the capture (gap owners, kernels per step, top kernels,
        ranges) as JSON at ``path``, where one came back: the trace it names stays on the
        backend's machine, and this is what says where a step's idle time falls."""
        if self.report is not None:
            with open(path, "w") as f:
                json.dump(self.report, f, indent=1)


def run_step(cfg: SweepConfig, batch: int, out: str, backend: BackendProcess | None) -> dict:
    step_dir = os.path.join(out, "steps", f"batch-{batch:03d}")
    os.makedirs(step_dir, exist_ok=True)
    if backend is not None:
        backend.restart(batch, os.path.join(step_dir, "backend.log"))
    before = {"gateway": observe.scrape(cfg.gateway_metrics, token=cfg.metrics_token),
              "backend": observe.scrape(cfg.backend_metrics)}
    sampler = observe.GpuSampler()
    sampler.start()
    profiler = LoadedProfile(cfg, records_file(step_dir)).start() \
        if cfg.profile_steps and cfg.profile_url else None
    try:
        records, rc = run_locust(cfg, batch, step_dir)
    finally:
        gpu = sampler.stop().summary()
    busy = profiler.result() if profiler is not None else \
        LoadedProfile.absent("no profile asked for (--profile-steps 0)")
    if profiler is not None:
        profiler.save(os.path.join(step_dir, "profile.json"))
    after = {"gateway": observe.scrape(cfg.gateway_metrics, token=cfg.metrics_token),
             "backend": observe.scrape(cfg.backend_metrics)}
    metrics = {k: observe.delta(before[k], after[k]) for k in before}
    with open(os.path.join(step_dir, "metrics_delta.json"), "w") as f:
        json.dump(metrics, f, indent=1)
    if cfg.gateway_log:
        time.sleep(_GATEWAY_LOG_FLUSH_S)  # the gateway flushes its request log every second
    row = build_row(cfg, batch, records, rc, gpu, metrics, read_gateway_log(cfg.gateway_log))
    row.update(busy)
    return row


def choose_best(cfg: SweepConfig, rows: list[dict]) -> tuple[dict | None, str]:
    """The largest batch size whose TTFT p<slo-percentile> meets the SLO, and a sentence."""
    if not cfg.ttft_slo_ms:
        return None, "No --ttft-slo-ms given: no batch size was judged against an SLO."
    pct = f"p{cfg.slo_percentile:g}"
    meeting = [r for r in rows if r["requests_ok"] and r["ttft_slo_percentile_ms"] is not None
               and r["ttft_slo_percentile_ms"] <= cfg.ttft_slo_ms]
    if not meeting:
        return None, f"No batch size met TTFT {pct} <= {cfg.ttft_slo_ms:g} ms."
    best = max(meeting, key=lambda r: r["batch_size"])
    return best, (f"Largest batch size meeting TTFT {pct} <= {cfg.ttft_slo_ms:g} ms: "
                  f"{best['batch_size']} (TTFT {pct} {best['ttft_slo_percentile_ms']:.1f} ms, "
                  f"goodput {best['goodput_req_s'] or 0:.2f} req/s = "
                  f"{best['goodput_tok_s'] or 0:.1f} output tok/s within the SLO).")


def sweep_warnings(cfg: SweepConfig, rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        b = r["batch_size"]
        if r["step_failed"]:
            out.append(f"batch {b}: {step_failure(r)}")
            continue
        if r["ttft_count"] < MIN_SAMPLES_P99:
            out.append(f"batch {b}: p99 from {r['ttft_count']} samples (< {MIN_SAMPLES_P99}); "
                       "raise --requests for a real p99")
        if r["generator_saturated"]:
            out.append(f"batch {b}: load generator saturated ({r['generator_reasons']}); "
                       "its timings are not trustworthy")
        if r["timing_noise"]:
            out.append(f"batch {b}: {r['timing_noise']}")
        if r["requests_failed"]:
            out.append(f"batch {b}: {r['requests_failed']} requests failed (see steps/)")
        if r["requests_ok"] < cfg.requests:
            out.append(f"batch {b}: only {r['requests_ok']} of {cfg.requests} measured "
                       f"requests completed (step timeout {cfg.step_timeout_s:g} s?)")
        seen = r.get("prompt_tokens_p50")
        # with the server's count the target includes the chat template, as usage does (a
        # local --tokenizer counts the content alone)
        if r.get("prompt_lengths_exact") is False or not cfg.tokenizer and \
                seen is not None and cfg.prompt_tokens and seen != cfg.prompt_tokens:
            out.append(f"batch {b}: prompts of {seen} tokens (median, from usage) for "
                       f"--prompt-tokens {cfg.prompt_tokens}; exact fit: "
                       f"{r.get('prompt_lengths_exact')}")
        cached = r.get("cached_prompt_tokens_p50")
        if cached and seen and cached >= seen / 2:
            out.append(f"batch {b}: the backend's prefix cache served {cached:g} of {seen:g} "
                       "prompt tokens (median): prefill is mostly a lookup, not the prompt "
                       "length's work")
        if r["tokens_from_usage"] < r["requests_ok"]:
            out.append(f"batch {b}: {r['requests_ok'] - r['tokens_from_usage']} responses "
                       "without usage; tokens counted from chunks (fallback)")
    if rows and not rows[0]["gpu_available"]:
        out.append("GPU-Util: unavailable — " + str(rows[0]["gpu"].get("reason")))
    elif rows and not (rows[0]["gpu"].get("gpm") or {}).get("available"):
        out.append("SM activity (NVML GPM): unavailable — "
                   + str((rows[0]["gpu"].get("gpm") or {}).get("reason")))
    return out


def step_failure(row: dict) -> str:
    """One sentence on a failed step: its most common error first."""
    if not row["errors"]:
        return "no request completed (and none recorded an error: see the step's locust.log)"
    top = row["errors"][0]
    return f"every request failed: {top['error']} ({top['count']}x)"


CSV_EXCLUDE = ("errors", "ttft_decomposition_ms", "decomposition_joined", "gateway_means_s",
               "backend_means_s", "gpu")


def write_outputs(cfg: SweepConfig, rows: list[dict], out: str) -> dict:
    best, verdict = choose_best(cfg, rows)
    settings = {k: v for k, v in asdict(cfg).items() if k not in ("metrics_token", "api_key")}
    meta = {"label": cfg.label, "model": cfg.model, "verdict": verdict,
            "best_batch_size": best["batch_size"] if best else None,
            "goodput_req_s": best["goodput_req_s"] if best else None,
            "goodput_tok_s": best["goodput_tok_s"] if best else None,
            "warnings": sweep_warnings(cfg, rows), "settings": settings,
            "written_unix": time.time()}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=2)
    seg_names = sorted({k for r in rows for k in r["ttft_decomposition_ms"]})
    fields = [k for k in rows[0] if k not in CSV_EXCLUDE] + [f"ttft_{s.replace(' ', '_')}_ms"
                                                              for s in seg_names]
    with open(os.path.join(out, "results.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for r in rows:
            flat = {k: v for k, v in r.items() if k not in CSV_EXCLUDE}
            for s in seg_names:
                flat[f"ttft_{s.replace(' ', '_')}_ms"] = r["ttft_decomposition_ms"].get(s)
            w.writerow(flat)
    charts = report.write_charts(rows, out, cfg.ttft_slo_ms)
    report.write_html(meta, rows, charts, os.path.join(out, "report.html"))
    return meta


def run_sweep(cfg: SweepConfig) -> dict:
    out = cfg.out or os.path.join("runs", time.strftime("sweep-%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    backend = (BackendProcess(cfg.backend_model, cfg.backend_port, cfg.backend_args,
                              cfg.backend_start_timeout_s) if cfg.restart_backend else None)
    rows = []
    try:
        for batch in cfg.batch_sizes:
            rows.append(run_step(cfg, batch, out, backend))
            if rows[-1]["step_failed"]:
                print(f"batch {batch}: {step_failure(rows[-1])}", flush=True)
    finally:
        if backend is not None:
            backend.stop()
    meta = write_outputs(cfg, rows, out)
    meta["out"] = out
    meta["failed_steps"] = [r["batch_size"] for r in rows if r["step_failed"]]
    return meta


def probe_e2e(cfg: SweepConfig) -> tuple[float | None, str | None]:
    """One request of the sweep's size, alone: (its E2E seconds, None) or (None, error)."""
    client = StreamingChatClient(cfg.host, cfg.api_key, timeout_s=cfg.step_timeout_s)
    body = {"model": cfg.model, "stream": True, "stream_options": {"include_usage": True},
            "max_tokens": cfg.output_tokens, "temperature": 0}
    # about prompt_tokens tokens of text (a short English word is about one token)
    text = " ".join(["hello"] * max(cfg.prompt_tokens - 8, 1))
    if cfg.endpoint == "chat":
        body["messages"], path = [{"role": "user", "content": text}], "/v1/chat/completions"
    else:
        body["prompt"], path = text, "/v1/completions"
    try:
        rec = client.stream_chat(body, cfg.model, path=path)
    finally:
        client.close()
    return (rec.e2e_s, None) if rec.ok and rec.e2e_s else (None, rec.error or "no answer")


def estimate_text(cfg: SweepConfig, probe_e2e_s: float | None) -> str:
    """How long the sweep will take: from one probe request and the sweep's own settings.

    Each step runs warm-up + measured requests at concurrency b, so about
    ceil(n / b) rounds of one request's E2E if batching cost nothing (it doesn't: larger
    batches take longer per round, so this is a lower bound); the step timeout caps it."""
    steps = len(cfg.batch_sizes)
    cap_s = steps * cfg.step_timeout_s
    head = (f"{steps} batch sizes x {cfg.requests} measured requests, each step capped at "
            f"{cfg.step_timeout_s:g} s (at most {cap_s / 60:.0f} min)")
    if probe_e2e_s is None:
        return f"estimated duration: unknown (the probe request failed); {head}"
    rounds = sum(-(-(cfg.requests + (b if cfg.warmup_requests is None
                                      else cfg.warmup_requests)) // b)
                 for b in cfg.batch_sizes)
    est = min(rounds * probe_e2e_s, cap_s)
    return (f"estimated duration: at least {est / 60:.0f} min ({rounds} rounds of "
            f"{probe_e2e_s:.1f} s, the E2E of one probe request on this machine; larger "
            f"batches take longer per round); {head}")


def _default_metrics_url(host: str) -> str:
    p = urlsplit(host)
    return f"{p.scheme}://{p.netloc}/metrics"


def parse_args(argv: list[str] | None = None) -> SweepConfig:
    p = argparse.ArgumentParser(prog="python -m loadtests.sweep", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", required=True, help="base URL of the gateway (or any OpenAI server)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--batch-sizes", default="1,2,4,8,16,32",
                   help="comma-separated concurrency levels")
    p.add_argument("--requests", type=int, default=100, help="measured requests per batch size")
    p.add_argument("--warmup-requests", type=int, default=None,
                   help="warm-up requests per step (default: the batch size)")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=256)
    p.add_argument("--ttft-slo-ms", type=float, default=None)
    p.add_argument("--slo-percentile", type=float, default=99.0)
    p.add_argument("--out", default="", help="output directory (default runs/sweep-<time>)")
    p.add_argument("--label", default="")
    p.add_argument("--gateway-metrics", default=None,
                   help="gateway /metrics URL (default: HOST/metrics; 'none' to skip)")
    p.add_argument("--backend-metrics", default=None, help="backend /metrics URL")
    p.add_argument("--gateway-log", default=None, help="gateway request log (JSONL) to join")
    p.add_argument("--tokenize-url", default=None, help="POST /tokenize URL (the backend's)")
    p.add_argument("--tokenizer", default=None, help="local tokenizer.json instead")
    p.add_argument("--endpoint", default="chat", choices=("chat", "completions"))
    p.add_argument("--seed", type=int, default=0,
                   help="prompt RNG seed; each batch size draws its own prompts from it")
    p.add_argument("--step-timeout", type=float, default=600.0, help="seconds per batch size")
    p.add_argument("--restart-backend", action="store_true",
                   help="start `python -m backend --max-num-seqs <batch>` for every step")
    p.add_argument("--backend-model", default="smollm2-135m-instruct")
    p.add_argument("--backend-port", type=int, default=8000)
    p.add_argument("--backend-args", default="", help="extra backend flags, one string")
    p.add_argument("--backend-start-timeout", type=float, default=600.0)
    p.add_argument("--profile-url", default=None,
                   help="the backend's POST /debug/profile URL (backend started with "
                        "--enable-profiling; bearer token from env BACKEND_PROFILE_TOKEN)")
    p.add_argument("--profile-steps", type=int, default=0,
                   help="engine steps to profile per batch size under load, for the "
                        "kernel-busy column (default: 0, none)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--api-key", default=os.environ.get("GATEWAY_API_KEY"),
                   help="client key (default: env GATEWAY_API_KEY; prefer the env var: a "
                        "flag shows in the process list)")
    a = p.parse_args(argv)
    gm = a.gateway_metrics or _default_metrics_url(a.host)
    return SweepConfig(
        host=a.host, model=a.model,
        batch_sizes=tuple(int(x) for x in a.batch_sizes.split(",") if x.strip()),
        requests=a.requests, warmup_requests=a.warmup_requests, prompt_tokens=a.prompt_tokens,
        output_tokens=a.output_tokens, ttft_slo_ms=a.ttft_slo_ms,
        slo_percentile=a.slo_percentile, out=a.out, label=a.label,
        gateway_metrics=None if gm == "none" else gm, backend_metrics=a.backend_metrics,
        metrics_token=os.environ.get("GATEWAY_METRICS_TOKEN"), gateway_log=a.gateway_log,
        tokenize_url=a.tokenize_url, tokenizer=a.tokenizer, endpoint=a.endpoint, seed=a.seed,
        step_timeout_s=a.step_timeout, restart_backend=a.restart_backend,
        backend_model=a.backend_model, backend_port=a.backend_port,
        backend_args=tuple(shlex.split(a.backend_args)),
        backend_start_timeout_s=a.backend_start_timeout, progress=not a.no_progress,
        api_key=a.api_key or None, profile_url=a.profile_url, profile_steps=a.profile_steps,
        profile_token=os.environ.get(PROFILE_TOKEN_ENV) or None)


def main(argv: list[str] | None = None) -> int:
    cfg = parse_args(argv)
    if not cfg.restart_backend:  # with --restart-backend nothing is up to probe yet
        e2e, error = probe_e2e(cfg)
        if error:
            print(f"warning: the probe request failed: {error}", flush=True)
        print(estimate_text(cfg, e2e), flush=True)
    meta = run_sweep(cfg)
    print(meta["verdict"])
    for w in meta["warnings"]:
        print("warning:", w)
    print(f"report: {os.path.join(meta['out'], 'report.html')}")
    return 1 if meta["failed_steps"] else 0


if __name__ == "__main__":
    sys.exit(main())
