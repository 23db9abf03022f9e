"""GPU benchmark of weight-only int8 / int4 against bf16 on Llama-2-7B shapes (synthetic
weights), in one run:

1. layer level: each 7B linear shape at M = 1 and M = 64 tokens, our Triton kernels against
   bf16 ``F.linear`` (cuBLAS), with the weight-byte floor at the GPU's peak bandwidth;
2. engine level: ``synthetic:llama-2-7b`` through LLMEngine with CUDA graphs, TPOT at batch 1
   and the decode step at batch 64, per ``--weights-dtype``.

    python -m benchmarks.quant --json out.json [--peak-gbs 4800] [--budget-s 200]

``--cpu bf16,int8,auto,auto+int8`` instead times the formats in-process on the CPU (batch-1
decode and a 512-token prefill), interleaved repetition by repetition. ``--cpu-crossover``
times SmolLM2's layer shapes on the CPU per number of tokens M: the packed int8/int4
kernels, the dequantise-then-dense path (``cpu_dequant``) and bf16, to place
``cpu_dequant.DENSE_MIN_ROWS``. ``--cpu-copy-crossover`` times the served model's quantised
layers as the engine keeps them (packed codes beside their dense prefill copies), every block
in turn so the weights come from memory as in a step, per M through the packed kernel and
through the copy, to place ``cpu_dequant.COPY_MIN_ROWS``.

Parts that would start after ``--budget-s`` seconds are skipped and listed as such.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from functools import partial
from itertools import cycle
from pathlib import Path

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import cpu_dequant, cpu_fp16
from backend.layers.linear import LinearRows, WeightFormat, make_linear
from backend.weights.loader import synthetic_source

# (name, out_features, in_features) of one Llama-2-7B block, q|k|v and gate|up fused.
SHAPES_7B = (("qkv", 12288, 4096), ("o", 4096, 4096), ("gate_up", 22016, 4096),
             ("down", 4096, 11008))
FORMATS = {"bf16": WeightFormat("dense", torch.bfloat16), "int8": WeightFormat("int8"),
           "int4-g32": WeightFormat("int4", None, 32), "int4-g128": WeightFormat("int4", None, 128)}


# SmolLM2-135M's block, fused like ours: (name, out_features, in_features).
SHAPES_SMOLLM2 = (("qkv", 960, 576), ("o", 576, 576), ("gate_up", 3072, 576),
                  ("down", 576, 1536))
CROSSOVER_M = (1, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512)


def _cpu_time_us(fn, reps: int) -> float:
    """Median of ``reps`` timed calls after one warm-up (the median rides out the shared
    VM's scheduler stalls)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e6


def _int8_packed(layer, x: torch.Tensor) -> torch.Tensor:
    return torch._weight_int8pack_mm(x, layer.q, layer.scale)


def _int8_dequant(layer, x: torch.Tensor) -> torch.Tensor:
    return cpu_dequant.int8_matmul(x, layer.q, layer.scale)


def _int4_packed(layer, x: torch.Tensor) -> torch.Tensor:
    return torch._weight_int4pack_mm_for_cpu(x, layer.packed, layer.group_size,
                                             layer.scale_zero)


def _int4_dequant(layer, x: torch.Tensor) -> torch.Tensor:
    return cpu_dequant.int4_matmul(x, layer.packed, layer.scale_zero, layer.group_size)


def cpu_crossover(reps: int) -> list[dict]:
    """Per SmolLM2 layer shape and M: packed kernel vs dequantise + dense vs bf16 and fp32
    dense, and fp16 weights under float32 activations as the layer runs them (fbgemm below
    ``cpu_fp16.DENSE_MIN_ROWS`` rows, widened + dense from there; where fbgemm runs) (µs;
    fp32 and fp16 take float32 activations, the rest bf16)."""
    cpu = torch.device("cpu")
    rows = []
    for name, N, K in SHAPES_SMOLLM2:
        w = torch.randn(N, K, generator=torch.Generator().manual_seed(0)) * 0.02
        dense = make_linear(WeightFormat("dense", torch.bfloat16), N, K, False, cpu,
                            torch.bfloat16)
        LinearRows(dense).load(w)
        dense32 = make_linear(WeightFormat("dense", torch.float32), N, K, False, cpu,
                              torch.float32)
        LinearRows(dense32).load(w)
        int8 = make_linear(WeightFormat("int8"), N, K, False, cpu, torch.bfloat16)
        LinearRows(int8).load(w)
        int4 = make_linear(WeightFormat("int4", None, 32), N, K, False, cpu, torch.bfloat16)
        LinearRows(int4).load(w)
        fp16 = make_linear(WeightFormat("dense", torch.float16), N, K, False, cpu,
                           torch.float32) if cpu_fp16.available() else None
        if fp16 is not None:
            LinearRows(fp16).load(w)
        paths = {
            "bf16": dense,
            "int8_packed": partial(_int8_packed, int8),
            "int8_dequant": partial(_int8_dequant, int8),
            "int4_packed": partial(_int4_packed, int4),
            "int4_dequant": partial(_int4_dequant, int4),
        }
        for M in CROSSOVER_M:
            x = torch.randn(M, K, dtype=torch.bfloat16)
            rows.append({"shape": name, "N": N, "K": K, "M": M,
                         **{p: round(_cpu_time_us(partial(fn, x), reps), 1)
                            for p, fn in paths.items()},
                         "fp32": round(_cpu_time_us(partial(dense32, x.float()), reps), 1),
                         "fp16_fbgemm": None if fp16 is None else
                         round(_cpu_time_us(partial(fp16, x.float()), reps), 1)})
    return rows


COPY_CROSSOVER_M = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16, 20, 24, 32, 48, 64, 128)


def cpu_copy_crossover(model: str, weights: str, reps: int) -> list[dict]:
    """Per M: ms for every quantised block layer of ``model`` (served with ``weights``, its
    dense prefill copies kept) through the packed kernel and through the copy; the paths
    interleaved repetition by repetition, medians and every sample."""
    from backend.layers.linear import Int4Linear, Int8Linear
    from backend.weights.loader import load_model_source

    # torch's int4 kernel, whose packing the int4 x int8 op would replace: the op's own
    # crossover is docs/benchmarks/cpu-epyc-1206/int4-w4a8/crossover.py's
    engine = LLMEngine(EngineConfig(weights_dtype=weights, prefill_dense_weights="on",
                                    kv_cache_memory_gib=0.05, max_model_len=256,
                                    enable_prefix_caching=False, cpu_int4_activations="model"),
                       load_model_source(model))
    layers = [m for m in engine.runner.model.layers.modules()
              if isinstance(m, (Int4Linear, Int8Linear)) and m.prefill_weight is not None]
    if not layers:
        raise SystemExit(f"{model} with --weights-dtype {weights}: no quantised layer keeps "
                         "a dense copy here")
    head = engine.runner.model.lm_head
    sets = {"": layers}
    if isinstance(head, (Int4Linear, Int8Linear)) and head.prefill_weight is not None:
        sets["head_"] = [head]  # alone: it reads its weight from memory every step
    rows = []
    for M in COPY_CROSSOVER_M:
        xs = {k: torch.randn(M, k, dtype=engine.runner.model.dtype)
              for k in {m.in_features for m in layers + [head]}}
        row = {"M": M, "layers": len(layers), "kernel": layers[0].kernel,
               "head_kernel": head.kernel}
        for prefix, members in sets.items():
            packed = _int4_packed if isinstance(members[0], Int4Linear) else _int8_packed
            paths = {"packed": packed, "copy": lambda m, x: m.copy_matmul(x)}
            samples: dict[str, list[float]] = {p: [] for p in paths}
            for _ in range(reps + 1):  # the first round warms up, not kept
                for p, fn in paths.items():
                    if prefix:
                        _evict_caches()
                    t = time.perf_counter()
                    for m in members:
                        fn(m, xs[m.in_features])
                    samples[p].append((time.perf_counter() - t) * 1e3)
            row.update({f"{prefix}{p}_ms": round(statistics.median(v[1:]), 3)
                        for p, v in samples.items()})
            row.update({f"{prefix}{p}_ms_samples": [round(t, 3) for t in v[1:]]
                        for p, v in samples.items()})
        rows.append(row)
    return rows


_EVICT = None


def _evict_caches() -> None:
    """Writes 64 MiB, so a weight timed next comes from memory as after a step's layers."""
    global _EVICT
    if _EVICT is None:
        _EVICT = torch.zeros(64 << 20, dtype=torch.uint8)
    _EVICT.add_(1)


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """The largest error of y against ref, relative to ref's largest magnitude."""
    return ((y.float() - ref).abs().max() / ref.abs().max()).item()


def graph_time_us(fn, iters: int = 50) -> float:
    """Median of CUDA-graph replays of ``iters`` calls (launch overhead excluded, as in the
    engine's decode graphs)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(iters):
            fn()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / iters)
    return statistics.median(times)


ROTATE_BYTES = 200 << 20  # weight copies a timing graph reads in turn (the H200's L2: 50 MB)


def copies_past_l2(nbytes: int, total: int = ROTATE_BYTES) -> int:
    """Copies of an ``nbytes`` weight for ``time_rotating``: enough that the calls in turn
    read ``total`` bytes, so no layer is served from L2."""
    return max(1, -(-total // nbytes))


def time_rotating(calls: list, device: torch.device, min_iters: int = 20) -> float:
    """µs per call of zero-argument ``calls`` run in turn (one per weight copy, so that no
    layer is served from L2): CUDA-graph replays of at least two rounds; off CUDA (smoke
    runs) the wall-clock time of one call."""
    if device.type != "cuda":
        t = time.perf_counter()
        calls[0]()
        return (time.perf_counter() - t) * 1e6
    turn = cycle(calls)
    return graph_time_us(lambda: next(turn)(), iters=max(min_iters, 2 * len(calls)))


def _weight_bytes(layer) -> int:
    return sum(t.numel() * t.element_size() for k, t in vars(layer).items()
               if isinstance(t, torch.Tensor) and not k.startswith("_") and k != "bias")


def layer_level(peak_gbs: float) -> list[dict]:
    dev = torch.device("cuda")
    rows = []
    for name, N, K in SHAPES_7B:
        w = torch.randn(N, K, device=dev, dtype=torch.bfloat16) * 0.02
        layers = {}
        for fmt_name, fmt in FORMATS.items():
            layer = make_linear(fmt, N, K, False, dev, torch.bfloat16)
            LinearRows(layer).load(w)
            layers[fmt_name] = layer
        for M in (1, 64):
            x = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
            for fmt_name, layer in layers.items():
                ref = x.float() @ layer.dequantized().t()
                err = rel_err(layer(x), ref)
                us = graph_time_us(partial(layer, x))
                nbytes = _weight_bytes(layer)
                rows.append({"shape": name, "N": N, "K": K, "M": M, "format": fmt_name,
                             "kernel": layer.kernel, "us": round(us, 2),
                             "weight_bytes": nbytes, "gb_s": round(nbytes / us / 1e3, 1),
                             "floor_us": round(nbytes / peak_gbs / 1e3, 2),
                             "max_rel_err_vs_dequantised": err})
        del layers, w
        torch.cuda.empty_cache()
    return rows


def engine_level(weights: str, group: int, decode_tokens: int = 48,
                 preset: str = "llama-2-7b", device: str = "cuda",
                 batches: tuple[int, ...] = (1, 64), head: str = "auto",
                 prompt_tokens: int = 16) -> dict:
    """Decode step time per batch size, on a synthetic model, after prompts of
    ``prompt_tokens``; ``head`` is the backend's ``--lm-head-dtype``."""
    source = synthetic_source(preset)
    t0 = time.perf_counter()
    engine = LLMEngine(EngineConfig(device=device, dtype="bfloat16", weights_dtype=weights,
                                    int4_group_size=group, max_num_seqs=64,
                                    max_model_len=1024, kv_cache_memory_gib=8.0,
                                    enable_prefix_caching=False, lm_head_dtype=head),
                       source)
    build_s = time.perf_counter() - t0
    stats = engine.stats()
    out = {"weights": stats.weights_format, "kernel": stats.linear_kernel, "head": stats.lm_head_format,
           "build_s": round(build_s, 1),
           "gpu_mem_gib": round(torch.cuda.memory_allocated() / 2**30, 2)
           if device == "cuda" else None}
    for batch in batches:
        params = SamplingParams(max_tokens=decode_tokens + 2, temperature=0.0, ignore_eos=True)
        for i in range(batch):
            engine.add_request(f"r{batch}-{i}", list(range(300 + i, 300 + i + prompt_tokens)),
                               params)
        while any(s.num_generated == 0 for s in engine.seqs.values()):
            engine.step()  # prefills (and their first tokens)
        engine.step()
        _sync(device)
        t = time.perf_counter()
        for _ in range(decode_tokens):
            engine.step()
        _sync(device)
        step_ms = (time.perf_counter() - t) * 1e3 / decode_tokens
        out[f"step_ms_batch{batch}"] = round(step_ms, 3)
        while engine.has_unfinished():
            engine.step()
    out["tpot_ms_batch1"] = out.get("step_ms_batch1")
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return out


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def cpu_interleaved(model: str, specs: list[str], reps: int, tokens: int) -> dict:
    """In-process, CPU: batch-1 decode tok/s and 512-token prefill seconds per weight format,
    the formats interleaved repetition by repetition so that load from other jobs hits all
    alike (medians and every sample)."""
    from backend.weights.loader import load_model_source

    source = load_model_source(model)
    engines = {}
    for spec in specs:
        name, _, head = spec.partition("+")
        engines[spec] = LLMEngine(EngineConfig(weights_dtype=name, lm_head_dtype=head or "model",
                                               kv_cache_memory_gib=0.25, max_model_len=1024,
                                               enable_prefix_caching=False), source)
    samples = {spec: {"decode_tok_s": [], "prefill512_s": []} for spec in specs}
    vocab = source.config.vocab_size
    for r in range(reps):
        for spec, engine in engines.items():
            prompt = torch.randint(100, vocab, (512,), generator=torch.Generator().manual_seed(r))
            t = time.perf_counter()
            engine.generate([prompt.tolist()], SamplingParams(max_tokens=1))
            samples[spec]["prefill512_s"].append(time.perf_counter() - t)
            engine.add_request(f"d{r}", prompt[:16].tolist(),
                               SamplingParams(max_tokens=tokens + 2, ignore_eos=True))
            engine.step()
            engine.step()
            t = time.perf_counter()
            for _ in range(tokens):
                engine.step()
            samples[spec]["decode_tok_s"].append(tokens / (time.perf_counter() - t))
            while engine.has_unfinished():
                engine.step()
    out = {}
    for spec, engine in engines.items():
        st = engine.stats()
        out[spec] = {"weights": st.weights_format, "kernel": st.linear_kernel,
                     "lm_head": st.lm_head_format, **samples[spec],
                     **{f"{k}_median": statistics.median(v) for k, v in samples[spec].items()}}
    return out


def _cpu_run(json_path: Path | None, measure) -> dict:
    """A CPU mode's result: what ``measure()`` returns between the load averages before and
    after it, written to ``json_path`` if given."""
    result = {"load_start": os.getloadavg(), "threads": torch.get_num_threads(), **measure(),
              "load_end": os.getloadavg()}
    if json_path:
        json_path.write_text(json.dumps(result, indent=1))
    return result


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--peak-gbs", type=float, default=4800.0, help="HBM bandwidth, GB/s")
    ap.add_argument("--budget-s", type=float, default=200.0)
    ap.add_argument("--engine", default="bf16,int8,int4:32", help="weights dtypes to serve")
    ap.add_argument("--cpu", default=None, metavar="SPECS",
                    help="CPU mode instead: interleaved in-process decode/prefill of these "
                         "formats, e.g. bf16,int8,auto,auto+int8")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="CPU mode's model")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--cpu-crossover", action="store_true",
                    help="CPU mode instead: per-layer packed vs dequantise+dense vs bf16 by M")
    ap.add_argument("--cpu-copy-crossover", metavar="WEIGHTS", default=None,
                    help="CPU mode instead: the model's layers (--model, served with this "
                         "--weights-dtype, e.g. auto) through the packed kernel vs their dense "
                         "copies by M")
    args = ap.parse_args(argv)
    if args.cpu_copy_crossover:
        result = _cpu_run(args.json, lambda: {
            "model": args.model, "weights": args.cpu_copy_crossover,
            "steps": cpu_copy_crossover(args.model, args.cpu_copy_crossover, args.reps)})
        print("   M  packed ms  copy ms  (every quantised block layer once)  head: packed  copy")
        for r in result["steps"]:
            print(f"{r['M']:4} {r['packed_ms']:9.2f} {r['copy_ms']:8.2f} "
                  f"{r.get('head_packed_ms', float('nan')):41.2f} "
                  f"{r.get('head_copy_ms', float('nan')):5.2f}")
        return
    if args.cpu_crossover:
        result = _cpu_run(args.json, lambda: {
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "layers": cpu_crossover(args.reps)})
        print("shape      M   bf16  int8_packed int8_dequant int4_packed int4_dequant (us)")
        for r in result["layers"]:
            print(f"{r['shape']:8} {r['M']:4} {r['bf16']:7.0f} {r['int8_packed']:10.0f} "
                  f"{r['int8_dequant']:10.0f} {r['int4_packed']:10.0f} "
                  f"{r['int4_dequant']:10.0f}")
        return
    if args.cpu:
        result = {"load_start": os.getloadavg(),
                  "formats": cpu_interleaved(args.model, args.cpu.split(","), args.reps,
                                             args.tokens),
                  "load_end": os.getloadavg(), "threads": torch.get_num_threads()}
        if args.json:
            args.json.write_text(json.dumps(result, indent=1))
        for spec, r in result["formats"].items():
            print(f"{spec:12} decode {r['decode_tok_s_median']:7.1f} tok/s  "
                  f"prefill512 {r['prefill512_s_median']:6.3f} s  {r['kernel']}")
        return
    start = time.perf_counter()
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "peak_gbs": args.peak_gbs, "layers": layer_level(args.peak_gbs), "engine": {},
              "skipped": []}
    for spec in args.engine.split(","):
        if time.perf_counter() - start > args.budget_s:
            result["skipped"].append(spec)
            continue
        name, _, group = spec.partition(":")
        try:
            result["engine"][spec] = engine_level(name, int(group or 32))
        except Exception as exc:  # report and go on: one failing format must not lose the rest
            result["engine"][spec] = {"error": repr(exc)[:500]}
    result["elapsed_s"] = round(time.perf_counter() - start, 1)
    text = json.dumps(result, indent=1)
    if args.json:
        args.json.write_text(text)
    print("layer     M  format      us   floor_us  GB/s")
    for r in result["layers"]:
        print(f"{r['shape']:8} {r['M']:3} {r['format']:9} {r['us']:8.1f} {r['floor_us']:8.1f} "
              f"{r['gb_s']:7.0f}  err {r['max_rel_err_vs_dequantised']:.1e}")
    for spec, r in result["engine"].items():
        print(spec, r)
    print("skipped:", result["skipped"], "elapsed", result["elapsed_s"])


if __name__ == "__main__":
    main()
