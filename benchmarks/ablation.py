"""The article's ablation table, reproduced in one run: each row adds one switch to the engine.

    python -m benchmarks.ablation --model synthetic:llama-2-7b --device cuda \
        --json runs/ablation.json --markdown runs/ablation.md

A fixed, seeded closed-loop workload driven in-process through LLMEngine
(``benchmarks.closed_loop``: 512-token prompts, 64 forced output tokens, ``--warmup`` then
``--requests`` measured requests per row). Rows:

1. baseline: math attention, no CUDA graphs, static scheduling, batch 1
2. + flash/Triton attention (``attention=auto``: triton on CUDA, sdpa on CPU)
3. + continuous batching, batch 8
4. + int8 KV cache
5. + CUDA graphs
6. + fused/compiled step (``compile``, the step kernels and ``async_scheduling`` as the
   device's defaults: on CUDA our fused Triton kernels and overlap scheduling, on the CPU the
   layer pieces compiled ahead of time, steps in turn)
7. tuned batch for a TTFT SLO: the row-6 engine at every concurrency of ``--batches`` under
   every scheduling policy of ``--policies``; the point whose TTFT p99 meets ``--slo-ms`` with
   the most output tok/s (a policy stops climbing at its first miss)

Columns: TTFT p50/p99, TPOT p50 ((t_last - t_first) / (tokens - 1) per request), output tok/s,
GPU-Util mean (NVML, sampled in a thread over the measured window), kernel-busy % (torch.profiler
over ``--profile-steps`` steps right after the window, same load: the time the GPU ran
something inside the steps' wall span / that span, from ``backend.profiling``'s report), % of
roofline: decode steps' bytes (weights + K/V read) / time against the copy bandwidth, and
steps with prefill: FLOPs / time against the matmul rate, both floors measured at the start
of the run (``benchmarks.roofline``).
GPU columns are "n/a" on the CPU, with the reason in the JSON.
The last line compares TTFT p50 and TPOT p50 at row 7's point with their floors: one prompt
alone and the decode bytes alone, then the floors at that load (``load_floors``: the prompts
the closed loop puts into every step counted too).

On CUDA each row runs in its own process (``--isolate-rows``): a torch.profiler capture left
the rest of its process slower, and an eager row measured after another row's capture ran
about 2 ms a step (20 %) slower on an H100 (docs/BENCHMARKS.md, "A profiler capture slowed
the rows after it"). Rows 6 and 7 share one, since row 7 measures row 6's engine: its points
still follow row 6's capture and each other's.
"""
from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
from backend.profiling.summary import kernel_busy_pct as summary_kernel_busy_pct
from benchmarks.closed_loop import ClosedLoop, LoopResult, run_with_gpu_util, seeded_prompts
from benchmarks.roofline import Floors, StepCost, measure_floors, step_cost
from loadtests.stats import summarize

# Each row's config, cumulative: row n = row n-1 + these fields.
ROWS: list[tuple[str, int | None, dict]] = [
    ("baseline: math attention, no CUDA graphs, static, batch 1", 1,
     dict(attention="math", cuda_graph=False, scheduling="static", max_num_seqs=1,
          kv_cache_dtype="auto", compile=False, async_scheduling=False)),
    ("+ flash/Triton attention", 1, dict(attention="auto")),
    ("+ continuous batching, batch 8", 8, dict(scheduling="continuous", max_num_seqs=8)),
    ("+ int8 KV cache", 8, dict(kv_cache_dtype="int8")),
    ("+ CUDA graphs", 8, dict(cuda_graph=True)),
    ("+ fused/compiled step", 8, dict(compile=True, async_scheduling=None)),
    ("tuned batch for the TTFT SLO", None, {}),
]
# The article's numbers for the same steps (docs: /work/shared/seed digest, one unnamed GPU, 7B).
ARTICLE = {1: {"ttft_ms": 320, "tpot_ms": 48, "gpu_util_pct": 22},
           2: {"ttft_ms": 180},
           3: {"ttft_ms": 210, "gpu_util_pct": 62, "note": "throughput doubled"},
           4: {"tpot_ms": 28, "gpu_util_pct": 78},
           5: {"ttft_ms": 185, "tpot_ms": 25, "gpu_util_pct": 85}}
# The step's fused and compiled kernels belong to row 6's switch: rows 1-5 run without them
# (our Triton norm / RoPE / SiLU kernels on CUDA, the layer pieces and head GEMV compiled
# ahead of time on the CPU); row 6 takes the engine's defaults for both (on where the
# device has them).
STEP_FUSION_OFF = {"fused_ops": False, "cpu_aot_kernels": "off"}
STEP_FUSION_ON = {"fused_ops": None, "cpu_aot_kernels": "auto"}
FLOOR_TARGET = 1.5  # measured within 1.5x of the floor counts as met
COLUMNS = ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "output_tok_s", "gpu_util_mean_pct",
           "kernel_busy_pct", "roofline_decode_pct", "roofline_prefill_pct")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--weights-dtype", default="auto")
    p.add_argument("--rows", default="1,2,3,4,5,6,7", help="comma-separated row numbers")
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--output-tokens", type=int, default=64)
    p.add_argument("--requests", type=int, default=32,
                   help="measured requests per row (row 7: at least 2 x the batch)")
    p.add_argument("--batch1-requests", type=int, default=16,
                   help="measured requests of rows 1-2 (batch 1: the slowest rows)")
    p.add_argument("--warmup", type=int, default=None,
                   help="warm-up requests per row (default: the row's concurrency)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="closed-loop clients of rows 3-6 (the article's batch 8)")
    p.add_argument("--slo-ms", type=float, default=200.0, help="TTFT p99 SLO of row 7")
    p.add_argument("--batches", default="8,16,32,64,128", help="row 7: concurrencies tried")
    p.add_argument("--policies", default="default,priority,budget",
                   help="row 7: scheduling policies tried: default, priority (prefill "
                        "priority), budget (max_prefill_tokens = prompt tokens), priority+budget")
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True,
                   help="rows 6-7 compile the step (--no-compile: the fused kernels alone "
                        "where the engine has them, else eager; e.g. on CPU)")
    p.add_argument("--profile-steps", type=int, default=8,
                   help="torch.profiler steps per row on CUDA (0: no kernel-busy column)")
    p.add_argument("--kv-cache-memory", type=float, default=None, metavar="GiB")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: prompt + output tokens rounded up to 256")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--isolate-rows", action=argparse.BooleanOptionalAction, default=None,
                   help="each row in its own process, rows 6 and 7 in one (default: on "
                        "CUDA, where a profiler capture slows the rest of its process)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--markdown", type=Path, default=None)
    return p.parse_args(argv)


def wanted_rows(a: argparse.Namespace) -> list[int]:
    """``--rows`` as sorted row numbers, each once."""
    return sorted({int(r) for r in a.rows.split(",")})


# options a row's own process gets from the run, not from the command line
_PER_PROCESS = {"--rows": True, "--json": True, "--markdown": True, "--isolate-rows": False,
                "--no-isolate-rows": False}


def row_groups(wanted: list[int]) -> list[list[int]]:
    """The rows one process each runs: every row alone, 7 with 6 (it measures 6's engine)."""
    groups = [[i] for i in wanted if i != 7]
    if 7 in wanted:
        if groups and groups[-1] == [6]:
            groups[-1].append(7)
        else:
            groups.append([7])
    return groups


def child_argv(argv: list[str]) -> list[str]:
    """The run's arguments without those ``_PER_PROCESS`` sets."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in _PER_PROCESS:
            skip = _PER_PROCESS[name] and "=" not in arg
            continue
        out.append(arg)
    return out


def run_isolated(a: argparse.Namespace, argv: list[str]) -> dict:
    """``run`` with each group of ``row_groups`` in a fresh ``python -m benchmarks.ablation``;
    their JSON merged. A group whose process fails gets failed rows with its exit status."""
    t_start = time.perf_counter()
    wanted = wanted_rows(a)
    rows, tuned, check, metas = [], None, None, []
    with tempfile.TemporaryDirectory(prefix="ablation-rows-") as tmp:
        for group in row_groups(wanted):
            out = Path(tmp) / f"rows-{'-'.join(map(str, group))}.json"
            cmd = [sys.executable, "-m", "benchmarks.ablation", *child_argv(argv),
                   "--rows", ",".join(map(str, group)), "--no-isolate-rows", "--json", str(out)]
            print(f"rows {group}: own process", flush=True)
            rc = subprocess.run(cmd).returncode
            if rc != 0 or not out.exists():
                reason = f"the rows' process exited with status {rc}"
                for i in group:
                    row = failed_row(reason)
                    row.update(row=i, name=ROWS[i - 1][0], error=reason,
                               article=ARTICLE.get(i, {}))
                    rows.append(row)
                continue
            res = json.loads(out.read_text())
            rows += res["rows"]
            metas.append(res["meta"])
            if 7 in group:
                tuned, check = res["tuned"], res["floors_check"]
    meta = dict(metas[0]) if metas else {"model": a.model, "device": a.device, "floors": None}
    meta.update(wall_s=time.perf_counter() - t_start, isolated_rows=True,
                floors_per_process=[m["floors"] for m in metas])
    return {"meta": meta, "rows": rows, "tuned": tuned, "floors_check": check}


def policies(names: str, prompt_tokens: int) -> dict[str, dict]:
    known = {"default": {"prefill_priority": False, "max_prefill_tokens": None},
             "priority": {"prefill_priority": True, "max_prefill_tokens": None},
             "budget": {"prefill_priority": False, "max_prefill_tokens": prompt_tokens},
             "priority+budget": {"prefill_priority": True, "max_prefill_tokens": prompt_tokens}}
    out = {}
    for name in names.split(","):
        if name not in known:
            raise SystemExit(f"unknown policy {name!r}; known: {', '.join(known)}")
        out[name] = known[name]
    return out


def row_configs(a: argparse.Namespace, base: dict, tuned_max: int) -> dict[int, dict]:
    """Row number -> (EngineConfig fields, concurrency)."""
    fields, out = dict(base), {}
    for i, (_, conc, update) in enumerate(ROWS, start=1):
        fields.update(update)
        if i == 1:
            fields.update(STEP_FUSION_OFF)
        if i == 3:
            fields.update(max_num_seqs=a.concurrency)
        if i == 6:
            fields.update(STEP_FUSION_ON)
            fields.update(compile=a.compile, max_num_seqs=max(tuned_max, a.concurrency))
        if i >= 3 and conc is not None:
            conc = a.concurrency
        out[i] = {"fields": dict(fields), "concurrency": conc}
    return out


class Bench:
    """Builds the rows' engines (sharing one model's weights where the configs allow) and
    measures them."""

    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.source = load_model_source(a.model)
        self.models: dict[tuple, object] = {}  # step ops -> a built model to share
        self.params = SamplingParams(max_tokens=a.output_tokens, ignore_eos=True, temperature=0.0)
        self.prompts = seeded_prompts(self.source.config.vocab_size, a.prompt_tokens, a.seed)
        self.floors: Floors | None = None
        self.tmp = Path(tempfile.mkdtemp(prefix="ablation-"))

    def build(self, fields: dict) -> tuple[LLMEngine, float]:
        t0 = time.perf_counter()
        key = (fields.get("compile"), fields.get("fused_ops"), fields.get("cpu_aot_kernels"))
        # the step's ops (compiled, fused) are applied to the model itself: only rows with the
        # same ops share one
        engine = LLMEngine(EngineConfig(**fields), self.source, model=self.models.get(key))
        self.models.setdefault(key, engine.runner.model)
        if self.floors is None:
            self.floors = measure_floors(engine.runner.device, engine.runner.dtype)
        return engine, time.perf_counter() - t0

    def measure(self, engine: LLMEngine, concurrency: int, measured: int) -> dict:
        a, cuda = self.a, engine.runner.device.type == "cuda"
        warmup = a.warmup if a.warmup is not None else concurrency
        loop = ClosedLoop(engine, self.prompts, self.params, concurrency)
        t0 = time.perf_counter()
        res, util = run_with_gpu_util(loop, warmup, measured,
                                      profile_steps=a.profile_steps if cuda else 0,
                                      profile_cuda=cuda, profile_dir=self.tmp)
        row = {"concurrency": concurrency, "warmup": warmup, "measured": measured,
               "run_s": time.perf_counter() - t0, **self.metrics(engine, res)}
        reasons = {}
        row["gpu_util_mean_pct"] = util.mean_pct
        if util.reason:
            reasons["gpu_util_mean_pct"] = util.reason
        else:
            row["gpu_util_samples"] = util.samples
        row["kernel_busy_pct"], why = kernel_busy_pct(res.profile, cuda, a.profile_steps)
        if why:
            reasons["kernel_busy_pct"] = why
        row["reasons"] = reasons
        return row

    def metrics(self, engine: LLMEngine, res: LoopResult) -> dict:
        ttft = summarize(r.ttft_s for r in res.records).scaled(1e3)
        tpot = summarize(r.tpot_s for r in res.records).scaled(1e3)
        cost = self.cost(engine)
        dec = [s for s in res.steps if s.prefill_tokens == 0 and s.decode_tokens]
        pre = [s for s in res.steps if s.prefill_tokens]
        dec_s, pre_s = sum(s.duration_s for s in dec), sum(s.duration_s for s in pre)
        decode_bw = sum(cost.decode_step_bytes(s.context_tokens) for s in dec) / dec_s \
            if dec_s else None
        prefill_rate = sum(cost.step_flops(s.prefill_tokens + s.decode_tokens, s.batch_size)
                           for s in pre) / pre_s if pre_s else None
        f = self.floors
        return {
            "ttft_p50_ms": ttft.p50, "ttft_p99_ms": ttft.p99, "ttft_count": ttft.count,
            "ttft_p99_reliable": ttft.p99_reliable, "tpot_p50_ms": tpot.p50,
            "tpot_p99_ms": tpot.p99, "output_tok_s": res.window_tokens / res.window_s,
            "window_s": res.window_s, "decode_steps": len(dec), "prefill_steps": len(pre),
            "decode_step_ms_mean": dec_s / len(dec) * 1e3 if dec else None,
            "decode_gb_s": decode_bw / 1e9 if decode_bw else None,
            "prefill_tflop_s": prefill_rate / 1e12 if prefill_rate else None,
            "roofline_decode_pct": 100 * decode_bw / f.copy_bytes_per_s if decode_bw else None,
            "roofline_prefill_pct": 100 * prefill_rate / f.matmul_flops_per_s
            if prefill_rate else None,
            "attention_kernel": engine.runner.attention_kernel,
            "cuda_graphs": engine.runner.graphs is not None,
        }

    def cost(self, engine: LLMEngine) -> StepCost:
        s, c = engine.stats(), engine.config
        return step_cost(self.source.config, s.weights_format, s.lm_head_format,
                         c.kv_cache_dtype, engine.runner.dtype, c.block_size)

    def floors_check(self, engine: LLMEngine, best: dict) -> dict:
        """TTFT and TPOT at the goodput-maximising batch against their floors."""
        a, f, cost = self.a, self.floors, self.cost(engine)
        ttft_floor = cost.step_floor_s(f, a.prompt_tokens, 1, 0) * 1e3  # the prompt alone
        ctx = best["concurrency"] * (a.prompt_tokens + a.output_tokens // 2)
        tpot_floor = cost.decode_step_bytes(ctx) / f.copy_bytes_per_s * 1e3
        out = {"concurrency": best["concurrency"], "policy": best.get("policy"),
               "target_x": FLOOR_TARGET}
        for name, got, floor in (("ttft", best["ttft_p50_ms"], ttft_floor),
                                 ("tpot", best["tpot_p50_ms"], tpot_floor)):
            out[f"{name}_p50_ms"], out[f"{name}_floor_ms"] = got, floor
            out[f"{name}_x_floor"] = got / floor
            out[f"{name}_met"] = got <= FLOOR_TARGET * floor
        out["at_this_load"] = load_floors(cost, f, best["concurrency"], a.prompt_tokens,
                                          a.output_tokens, best["ttft_p50_ms"],
                                          best["tpot_p50_ms"])
        return out

    def close(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


def kernel_busy_pct(report: dict | None, cuda: bool, steps: int) -> tuple[float | None, str | None]:
    """The time the GPU ran a kernel, copy or memset inside the counted steps' wall span, over
    that span (``backend.profiling.summary.kernel_busy_pct``)."""
    if not cuda:
        return None, "the engine runs on the CPU: no GPU kernels to profile"
    if not steps or report is None:
        return None, "no profile taken (--profile-steps 0)"
    return summary_kernel_busy_pct(report)


def failed_row(reason: str) -> dict:
    """A row without numbers: every column null, each with the reason."""
    return {"concurrency": None, **{c: None for c in COLUMNS},
            "reasons": {c: reason for c in COLUMNS}}


def release() -> None:
    """Return the memory of engines no longer referenced (KV caches, CUDA graph pools)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def tune(bench: Bench, engine: LLMEngine, a: argparse.Namespace) -> dict:
    """Row 7: every policy, concurrency rising until TTFT p99 misses the SLO."""
    points = []
    batches = sorted(int(b) for b in a.batches.split(","))
    for name, knobs in policies(a.policies, a.prompt_tokens).items():
        engine.scheduler.configure(knobs["max_prefill_tokens"], knobs["prefill_priority"])
        engine.config = engine.config.model_copy(update=knobs)
        for b in batches:
            r = bench.measure(engine, b, max(a.requests, 2 * b))
            r.update(policy=name, knobs=knobs, meets_slo=r["ttft_p99_ms"] <= a.slo_ms)
            points.append(r)
            print(f"  row 7 {name:>16} batch {b:>4}: TTFT p99 {r['ttft_p99_ms']:8.1f} ms, "
                  f"TPOT p50 {r['tpot_p50_ms']:7.2f} ms, {r['output_tok_s']:8.1f} tok/s"
                  f"{'' if r['meets_slo'] else '  (misses the SLO)'}", flush=True)
            if not r["meets_slo"]:
                break
    ok = [p for p in points if p["meets_slo"]]
    best = max(ok, key=lambda p: p["output_tok_s"]) if ok else None
    return {"points": points, "best": best}


def run(a: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    wanted = wanted_rows(a)
    batches = [int(b) for b in a.batches.split(",")]
    max_len = a.max_model_len or -(-(a.prompt_tokens + a.output_tokens) // 256) * 256
    base = dict(device=a.device, dtype=a.dtype, weights_dtype=a.weights_dtype,
                max_model_len=max_len, kv_cache_memory_gib=a.kv_cache_memory,
                enable_prefix_caching=False)
    configs = row_configs(a, base, max(batches))
    bench = Bench(a)
    rows, tuned, check, kept = [], None, None, None
    try:
        for i in wanted:
            name = ROWS[i - 1][0]
            fields = configs[6 if i == 7 else i]["fields"]
            engine, build_s = None, 0.0
            try:
                if i == 7 and kept is not None:
                    engine = kept  # row 6's engine, already warm
                else:
                    kept = None
                    release()
                    engine, build_s = bench.build(fields)
                print(f"row {i}: {name} (engine built in {build_s:.1f} s)", flush=True)
                if i == 7:
                    tuned = tune(bench, engine, a)
                    best = tuned["best"]
                    row = dict(best) if best else failed_row(
                        f"no concurrency of {a.batches} met TTFT p99 <= {a.slo_ms} ms")
                    if best:
                        check = bench.floors_check(engine, best)
                else:
                    conc = configs[i]["concurrency"]
                    row = bench.measure(engine, conc, a.batch1_requests if conc == 1
                                        else a.requests)
                    print(f"  TTFT p50 {row['ttft_p50_ms']:.1f} ms, TPOT p50 "
                          f"{row['tpot_p50_ms']:.2f} ms, {row['output_tok_s']:.1f} tok/s "
                          f"({row['run_s']:.1f} s)", flush=True)
            except Exception as exc:  # noqa: BLE001 - one broken row must not lose the table
                print(f"row {i} failed: {type(exc).__name__}: {exc}", flush=True)
                row = failed_row(f"{type(exc).__name__}: {exc}")
                row["error"] = f"{type(exc).__name__}: {exc}"
            row.update(row=i, name=name, build_s=build_s, config={
                k: v for k, v in fields.items() if k not in base},
                article=ARTICLE.get(i, {}))
            rows.append(row)
            kept = engine if i == 6 and 7 in wanted else None
            engine = None
            release()
    finally:
        kept = engine = None
        release()
        bench.close()
    return {"meta": {
        "model": a.model, "device": a.device,
        "gpu": torch.cuda.get_device_name() if a.device.startswith("cuda") else None,
        "prompt_tokens": a.prompt_tokens, "output_tokens": a.output_tokens,
        "requests": a.requests, "concurrency": a.concurrency, "slo_ms": a.slo_ms,
        "batches": batches, "policies": a.policies.split(","), "max_model_len": max_len,
        "floors": bench.floors.as_dict() if bench.floors else None,
        "wall_s": time.perf_counter() - t_start, "torch": torch.__version__},
        "rows": rows, "tuned": tuned, "floors_check": check}


def load_floors(cost: StepCost, floors: Floors, batch: int, prompt: int, output: int,
                ttft_ms: float, tpot_ms: float) -> dict:
    """The floors of the steps this closed loop must run at ``batch`` clients: each stream
    ends after ``output`` tokens and its client sends the next prompt, so an average step
    carries ``batch`` decode rows and ``batch / output`` prompts of ``prompt`` tokens; every
    stream gets one token a step (TPOT's floor), and a request's first token needs a step
    carrying its whole prompt beside the other streams' decodes (TTFT's). What the floors
    above leave out: the prefill work the load puts into every step; what these leave out:
    waiting for the step in flight when a request arrives."""
    ctx = batch * (prompt + output / 2)
    step = cost.step_floor_s(floors, batch + batch * prompt / output, batch, ctx) * 1e3
    first = cost.step_floor_s(floors, prompt + batch - 1, batch, ctx) * 1e3
    return {"prefill_tokens_per_step": batch * prompt / output, "step_floor_ms": step,
            "tpot_x": tpot_ms / step, "tpot_met": tpot_ms <= FLOOR_TARGET * step,
            "prompt_step_floor_ms": first, "ttft_x": ttft_ms / first,
            "ttft_met": ttft_ms <= FLOOR_TARGET * first}


def _fmt(v: float | None, spec: str = ".1f", unit: str = "") -> str:
    return "n/a" if v is None else f"{v:{spec}}{unit}"


def markdown(res: dict) -> str:
    lines = ["| row | config | batch | TTFT p50 / p99 (ms) | TPOT p50 (ms) | output tok/s | "
             "GPU-Util | kernel-busy | roofline decode / prefill | article TTFT / TPOT / GPU-Util |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in res["rows"]:
        art = r["article"]
        name = r["name"] + (f" ({r['policy']})" if r.get("policy") else "")
        lines.append(
            f"| {r['row']} | {name} | {_fmt(r.get('concurrency'), 'd') if r.get('concurrency') else 'n/a'} "
            f"| {_fmt(r.get('ttft_p50_ms'))} / {_fmt(r.get('ttft_p99_ms'))} "
            f"| {_fmt(r.get('tpot_p50_ms'), '.2f')} | {_fmt(r.get('output_tok_s'), '.0f')} "
            f"| {_fmt(r.get('gpu_util_mean_pct'), '.0f', ' %')} "
            f"| {_fmt(r.get('kernel_busy_pct'), '.0f', ' %')} "
            f"| {_fmt(r.get('roofline_decode_pct'), '.0f', ' %')} / "
            f"{_fmt(r.get('roofline_prefill_pct'), '.0f', ' %')} "
            f"| {_art(art, 'ttft_ms')} / {_art(art, 'tpot_ms')} / {_art(art, 'gpu_util_pct', ' %')} |")
    lines.append("")
    lines.append(final_line(res))
    return "\n".join(lines) + "\n"


def _art(art: dict, key: str, unit: str = " ms") -> str:
    return f"~{art[key]}{unit}" if key in art else "—"


def final_line(res: dict) -> str:
    c = res.get("floors_check")
    if not c:
        return "goodput-maximising batch: none (row 7 not run, or no batch met the SLO)"
    mark = {True: "met", False: "missed"}
    line = (f"goodput-maximising batch {c['concurrency']} ({c['policy']}): "
            f"TTFT p50 {c['ttft_p50_ms']:.1f} ms vs floor {c['ttft_floor_ms']:.1f} ms "
            f"({c['ttft_x_floor']:.1f}x, target <= {c['target_x']}x: {mark[c['ttft_met']]}); "
            f"TPOT p50 {c['tpot_p50_ms']:.2f} ms vs floor {c['tpot_floor_ms']:.2f} ms "
            f"({c['tpot_x_floor']:.1f}x: {mark[c['tpot_met']]})")
    if w := c.get("at_this_load"):
        line += (f". At this load (every step {c['concurrency']} decodes and "
                 f"{w['prefill_tokens_per_step']:.0f} prompt tokens on average): a step's "
                 f"floor {w['step_floor_ms']:.2f} ms, TPOT {w['tpot_x']:.2f}x it "
                 f"({mark[w['tpot_met']]}); a step carrying a whole prompt "
                 f"{w['prompt_step_floor_ms']:.1f} ms, TTFT {w['ttft_x']:.2f}x it "
                 f"({mark[w['ttft_met']]})")
    return line


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse_args(argv)
    torch.manual_seed(a.seed)
    isolate = a.isolate_rows if a.isolate_rows is not None else a.device.startswith("cuda")
    res = run_isolated(a, argv) if isolate else run(a)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    table = markdown(res)
    if a.markdown:
        a.markdown.parent.mkdir(parents=True, exist_ok=True)
        a.markdown.write_text(table)
    f = res["meta"]["floors"]
    if f:
        print(f"floors: copy {f['copy_gb_s']:.0f} GB/s, matmul {f['matmul_tflop_s']:.1f} "
              f"TFLOP/s ({f['dtype']}, n={f['matmul_n']})")
    print(f"wall {res['meta']['wall_s']:.0f} s")
    print(table, end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
