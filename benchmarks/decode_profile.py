"""Profile the engine's steady decode at fixed batch sizes, without nsys.

For each batch size B: B requests with seeded prompts are prefilled, then the engine runs
``--warmup`` decode steps, ``--baseline`` steps outside any capture (step time, and NVML
GPU-Util / GPM SM activity over them where the GPU has GPM), then ``--steps`` steps inside a
torch.profiler capture (StepProfiler, as POST /debug/profile does), then the rest is aborted.
Writes per batch size ``profile-bB.json`` (the report, capture slowdown, GPM) and the trace
``profile-bB.trace.json.gz``, and prints the three numbers as a table.

    python -m benchmarks.decode_profile --model synthetic:llama-2-7b --device cuda \
        --dtype bfloat16 --batch 1 64 --out runs/profiles
"""
from __future__ import annotations

import argparse
import dataclasses
import gzip
import json
import random
import shutil
import threading
import time
from pathlib import Path

import torch

from backend.cli import rows_or_auto
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import StepStats
from backend.engine.sampling import SamplingParams
from backend.profiling.capture import CaptureJob, StepProfiler
from backend.profiling.gpm import GpmDevice
from backend.profiling.summary import render
from backend.weights.loader import load_model_source


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="synthetic:llama-2-7b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--weights-dtype", default="auto", help="as the backend's flag")
    p.add_argument("--int4-group-size", type=int, default=32)
    p.add_argument("--lm-head-dtype", default="auto", help="as the backend's flag")
    p.add_argument("--prefill-dense-weights", default="auto", help="as the backend's flag")
    p.add_argument("--gpu-copy-min-rows", default=None, type=rows_or_auto,
                   help="as the backend's flag: a row count or auto (default: 65)")
    p.add_argument("--cpu-int4-activations", default="int8x2", help="as the backend's flag")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64])
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--warmup", type=int, default=10, help="decode steps before measuring")
    p.add_argument("--baseline", type=int, default=30, help="decode steps outside a capture")
    p.add_argument("--steps", type=int, default=50,
                   help="decode steps inside the capture (0: no capture, e.g. under ncu)")
    p.add_argument("--num-layers", type=int, default=None,
                   help="synthetic models only: keep this many layers (same kernel shapes, "
                        "less memory for ncu to save and restore)")
    p.add_argument("--kv-cache-memory", type=float, default=None, metavar="GiB")
    p.add_argument("--cuda-graph", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None,
                   help="overlap scheduling (default: the engine's, on CUDA only)")
    p.add_argument("--max-model-len", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("runs/profiles"))
    return p.parse_args(argv)


class _LastStep:
    """The latest step's statistics, and since ``reset`` how many steps were observed and
    the fewest decodes one had."""

    def __init__(self) -> None:
        self.stats: StepStats | None = None
        self.reset()

    def reset(self) -> None:
        self.steps, self.min_decodes = 0, None

    def __call__(self, stats: StepStats) -> None:
        self.stats, self.steps = stats, self.steps + 1
        n = stats.num_decode_tokens
        self.min_decodes = n if self.min_decodes is None else min(self.min_decodes, n)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _check_whole_batch(last: _LastStep, batch: int, steps: int) -> None:
    """Every step since ``last.reset()`` decoded the whole batch (with overlap scheduling
    the latest step is observed one step late)."""
    if last.steps < steps - 1 or last.min_decodes != batch:
        raise RuntimeError(f"the batch of {batch} shrank while measured: raise --max-model-len")


def profile_batch(engine: LLMEngine, last: _LastStep, batch: int, a: argparse.Namespace,
                  vocab: int, gpm: GpmDevice | None) -> dict:
    rng = random.Random(a.seed + batch)
    # As many tokens as fit (the requests are aborted at the end): the early requests decode
    # while later prompts prefill, and none may finish while the steps are measured.
    total = a.max_model_len - a.prompt_tokens
    ids = [f"b{batch}-{i}" for i in range(batch)]
    for rid in ids:
        prompt = [rng.randrange(3, vocab) for _ in range(a.prompt_tokens)]
        engine.add_request(rid, prompt, SamplingParams(max_tokens=total, ignore_eos=True))
    prof = StepProfiler()
    device = engine.runner.device
    prof.warm(device.type == "cuda")  # Kineto/CUPTI init: once per process, as the server does
    try:
        for _ in range(10 * batch + 100):  # prefill (chunked) until all B decode together
            prof.run_step(engine.step)
            s = last.stats  # None until a step is observed (a step later with overlap)
            if s is not None and s.num_prefill_tokens == 0 and s.num_decode_tokens == batch:
                break
        for _ in range(a.warmup):
            prof.run_step(engine.step)
        _sync(device)
        if gpm is not None and gpm.available:
            gpm.read()  # starts the GPM interval at the baseline
        last.reset()
        t0 = time.perf_counter()
        base = []
        for _ in range(a.baseline):
            s0 = time.perf_counter()
            prof.run_step(engine.step)
            base.append(time.perf_counter() - s0)
        base_s = time.perf_counter() - t0
        _check_whole_batch(last, batch, a.baseline)
        reading = gpm.read().as_dict() if gpm is not None and gpm.available else None
        if a.steps == 0:
            return {"batch_size": batch, "baseline_only": True,
                    "step_ms_mean": base_s / a.baseline * 1e3}
        done = threading.Event()
        box: list = []
        a.out.mkdir(parents=True, exist_ok=True)
        last.reset()
        prof.start(CaptureJob(a.steps, a.out, lambda r: (box.append(r), done.set()),
                              name=f"trace-b{batch}", cuda=device.type == "cuda"))
        while prof.busy:  # the counted steps, after a lead step on CUDA
            prof.run_step(engine.step)
        if not done.wait(600):
            raise RuntimeError("the capture's export did not finish")
        report = box[0]
        if isinstance(report, BaseException):
            raise report
    finally:
        for rid in ids:
            engine.abort_request(rid)
    _check_whole_batch(last, batch, a.steps)
    base.sort()
    report["batch_size"] = batch
    during = report["capture"]["step_ms_during"]
    # the same B decodes right before the capture: the capture's own cost per step
    report["capture"]["slowdown_vs_baseline"] = during / (base_s / a.baseline * 1e3) - 1
    report["baseline"] = {
        "steps": a.baseline, "step_ms_mean": base_s / a.baseline * 1e3,
        "step_ms_p50": base[len(base) // 2] * 1e3,
        "output_tok_s": batch * a.baseline / base_s,
        "gpm": reading, "gpm_reason": None if gpm is not None and gpm.available
        else (gpm.reason if gpm is not None else "not a CUDA device")}
    return report


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    torch.manual_seed(a.seed)
    source = load_model_source(a.model)
    if a.num_layers is not None:
        if source.weights is not None:
            raise SystemExit("--num-layers works on synthetic models only")
        source = dataclasses.replace(source, config=source.config.model_copy(
            update={"num_hidden_layers": a.num_layers}))
    last = _LastStep()
    config = EngineConfig(device=a.device, dtype=a.dtype, weights_dtype=a.weights_dtype,
                          int4_group_size=a.int4_group_size, lm_head_dtype=a.lm_head_dtype,
                          prefill_dense_weights=a.prefill_dense_weights,
                          gpu_copy_min_rows=a.gpu_copy_min_rows,
                          cpu_int4_activations=a.cpu_int4_activations, max_num_seqs=max(a.batch),
                          max_num_batched_tokens=max(2048, a.prompt_tokens),
                          kv_cache_memory_gib=a.kv_cache_memory, cuda_graph=a.cuda_graph,
                          async_scheduling=a.async_scheduling, max_model_len=a.max_model_len)
    engine = LLMEngine(config, source, step_observer=last)
    gpm = None
    if engine.runner.device.type == "cuda":
        gpm = GpmDevice(engine.runner.device.index or 0)
        gpm.open()
    rows = []
    for batch in a.batch:
        r = profile_batch(engine, last, batch, a, source.config.vocab_size, gpm)
        st = engine.stats()
        r["weights"], r["lm_head"] = st.weights_format, st.lm_head_format
        r["linear_kernel"], r["one_token_kernel"] = st.linear_kernel, st.one_token_kernel
        r["dense_copies"] = st.prefill_dense_weights.get("enabled", False)
        r["gpu_copy_rows"] = st.gpu_copy_rows
        if a.steps == 0:
            print(json.dumps(r), flush=True)
            continue
        trace = Path(r["trace"])
        packed = a.out / f"profile-b{batch}.trace.json.gz"
        with open(trace, "rb") as src, gzip.open(packed, "wb") as dst:
            shutil.copyfileobj(src, dst)
        trace.unlink()
        r["trace"] = packed.name
        r["model"], r["device"], r["dtype"] = a.model, str(engine.runner.device), \
            str(engine.runner.dtype).removeprefix("torch.")
        r["cuda_graph"] = engine.runner.graphs is not None
        r["gpu_name"] = torch.cuda.get_device_name(engine.runner.device) \
            if engine.runner.device.type == "cuda" else None
        (a.out / f"profile-b{batch}.json").write_text(json.dumps(r, indent=1) + "\n")
        print(f"== batch {batch}\n{render(r)}", flush=True)
        rows.append(r)
    if not rows:  # --steps 0: the JSON lines above are the result
        return 0
    print(f"{'batch':>5} {'gap':>7} {'memcpy':>7} {'k/step':>7} {'step ms':>8} "
          f"{'in capture':>10} {'tok/s':>8} {'util':>5} {'SM act':>6}")
    for r in rows:
        c, b, g = r["capture"], r["baseline"], r["baseline"]["gpm"] or {}

        def pct(v: float | None) -> str:
            return "n/a" if v is None else f"{v:.1%}"
        print(f"{r['batch_size']:>5} {pct(r['kernel_gap_ratio']):>7} {pct(r['memcpy_share']):>7} "
              f"{r['kernels_per_step'] or 0:>7.0f} {b['step_ms_mean']:>8.2f} "
              f"{c['step_ms_during'] or 0:>10.2f} {b['output_tok_s']:>8.0f} "
              f"{pct(g.get('util')):>5} {pct(g.get('sm_active')):>6}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
