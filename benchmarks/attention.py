"""GPU attention benchmark: our Triton paged kernels against the hardware and SDPA flash,
then the engine (LLMEngine driven directly) on synthetic Llama-2-7B shapes, in one run.

    python -m benchmarks.attention [--json PATH] [--sections decode,prefill,engine,engine_kv]
                                   [--sweep] [--decode-grid B,..:CTX,..:KV,..]
                                   [--engine-kv KV,..]

1. Copy bandwidth: a 4 GiB device-to-device copy, (read + written bytes) / time.
2. Paged decode (one layer, 32 query / 32 KV heads, head_dim 128, block 16, scrambled
   blocks): batch 1/8/64 x context 512/4k/32k x KV bf16/int8/fp8_e4m3. Achieved bandwidth
   = K/V bytes read (scales included) / time, beside the copy bandwidth. Timed with
   ``triton.testing.do_bench`` (L2 flushed before every call). First, a correctness check
   on the GPU: store kernel + decode kernel against softmax over the torch dequantising
   gather, per KV dtype (max |difference|). ``--sweep`` adds tile / warp / pipeline-depth
   / split variants at batch 64 x 4k, each with its max |difference| from the default.
3. Prefill (one layer, 32 heads, head_dim 128, causal, bf16): ours over the paged cache
   against SDPA restricted to flash on the same shapes laid out contiguously; TFLOP/s from
   the causal FLOP count (4 * hd * heads * sum(n (n + 1) / 2)).
4. Engine, bf16, random weights, prefix caching off: TPOT at batch 1 and 64 (512-token
   prompts, 64 new tokens, context about 544), TTFT of one 512-token prompt, ms per decode
   step at batch 32 / context 512 with max_model_len 1k and 32k, and the slowest step over
   the median of the steps with the same token count; for the triton and sdpa backends.
5. Engine ms per decode step at batch 32, context about 4k, bf16 against int8 (and with
   ``--engine-kv``, fp8) KV (triton).

``--step-ops eager,triton,compile`` runs the engine section (triton attention) once per
way of running the work between attention calls (``backend.engine.step_ops``) and adds
for each: engine build time (compilation included), GPU kernels per eager decode step
(torch.profiler over one step with the CUDA graphs set aside) and the greedy tokens of one
prompt, so the variants can be compared token for token.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from backend.engine._tools import emit_json
from backend.engine.config import EngineConfig
from backend.engine.cuda_graph import count_gpu_ops
from backend.engine.llm_engine import LLMEngine
from backend.engine.outputs import StepStats
from backend.engine.sampling import SamplingParams
from backend.engine.step_ops import STEP_OPS_FIELDS
from backend.layers import fused_ops, triton_attention
from backend.layers.kv_cache import KVCache, bytes_per_block, kv_storage_dtype
from backend.weights.loader import synthetic_source

H, KVH, HD, BS = 32, 32, 128, 16  # Llama-2-7B attention
DEV = torch.device("cuda")


def copy_bandwidth(gib: float = 4.0) -> float:
    """Bytes read + written per second by a device-to-device copy."""
    n = int(gib * 2**30)
    src = torch.empty(n, dtype=torch.uint8, device=DEV)
    dst = torch.empty_like(src)
    ms = triton.testing.do_bench(partial(dst.copy_, src), warmup=50, rep=300)
    del src, dst
    return 2 * n / (ms * 1e-3)


def _paged(batch: int, ctx: int, kind: str, gen: torch.Generator):
    """A one-layer cache holding batch x ctx tokens in scrambled blocks."""
    nb = -(-ctx // BS)
    blocks = batch * nb
    store = kv_storage_dtype(kind, torch.bfloat16)
    shape = (blocks * BS, 2, KVH, HD)
    if kind == "auto":
        cache = torch.randn(shape, dtype=torch.bfloat16, device=DEV, generator=gen)
        scales = None
    else:
        cache = torch.randint(-100, 100, shape, dtype=torch.int8, device=DEV,
                              generator=gen).view(store)
        if kind == "fp8_e4m3":
            cache &= 0x77  # finite, moderate e4m3 values
        scales = torch.rand(2, KVH, blocks * BS, device=DEV, generator=gen) * 0.02
    perm = torch.randperm(blocks, device=DEV, generator=gen).to(torch.int32)
    tables = perm.view(batch, nb)
    return cache, scales, tables


_SWEEP_SHAPES = ((64, 4096),)


def _decode_configs(batch: int, ctx: int, splits: int, sweep: bool, kind: str) -> list[dict]:
    """The engine's defaults first; with sweep, other tiles, warps, pipeline depths and
    splits."""
    configs = [dict(num_splits=splits)]
    if not (sweep and (batch, ctx) in _SWEEP_SHAPES):
        return configs
    stages = triton_attention.decode_tile(kind, splits)[2]
    configs += [dict(num_splits=splits, block_n=bn, num_warps=w) for bn, w in
                (((64, 8), (128, 4)) if kind == "auto" else ((64, 4), (256, 4)))]
    configs += [dict(num_splits=splits, num_stages=st) for st in (2, 3, 4)
                if st != stages and (kind != "auto" or st == 3)]
    if kind != "auto":
        configs += [dict(num_splits=splits, block_n=bn, num_stages=3) for bn in (64, 256)]
        configs += [dict(num_splits=sp) for sp in (splits // 2, splits * 2)
                    if 1 <= sp <= 64 and sp != splits]
    return configs


def bench_decode(batches: list[int], contexts: list[int], kinds: list[str],
                 sweep: bool) -> list[dict]:
    gen = torch.Generator(device=DEV).manual_seed(0)
    rows = []
    for kind in kinds:
        for ctx in contexts:
            for batch in batches:
                cache, scales, tables = _paged(batch, ctx, kind, gen)
                lens = torch.full((batch,), ctx, dtype=torch.int32, device=DEV)
                q = torch.randn(batch, H, HD, dtype=torch.bfloat16, device=DEV, generator=gen)
                out = torch.empty_like(q)
                splits = triton_attention.decode_splits(batch, KVH, None, DEV)  # graphs'
                elem = cache.element_size()
                read = batch * ctx * 2 * KVH * (HD * elem + (4 if scales is not None else 0))
                first = None
                for i, cfg in enumerate(_decode_configs(batch, ctx, splits, sweep, kind)):
                    fn = partial(triton_attention.paged_decode,
                                 q, cache, scales, tables, lens, out, HD ** -0.5, BS, kind, **cfg)
                    ms = triton.testing.do_bench(fn, warmup=10, rep=50)
                    row = {"kv": kind, "batch": batch, "context": ctx, "default": i == 0,
                           **cfg, "us": ms * 1e3, "kv_bytes": read,
                           "gb_s": read / (ms * 1e-3) / 1e9}
                    if i == 0:
                        first = out.float().clone()
                    else:
                        row["max_abs_diff_vs_default"] = (out.float() - first).abs().max().item()
                    if i == 0 and read < 2**25:  # small: launch-bound; also inside a graph
                        row["us_in_cuda_graph_l2_warm"] = \
                            triton.testing.do_bench_cudagraph(fn, rep=50) * 1e3
                    rows.append(row)
                del cache, scales
                torch.cuda.empty_cache()
    return rows


def check_quantised_decode(kinds: list[str]) -> dict:
    """On the GPU, the store kernel then the decode kernel (each cache layout as the
    engine uses it) against softmax attention over ``KVCache.gather`` (the torch
    dequantising reference): max |difference| per KV dtype, scattered blocks, contexts
    not multiples of the block."""
    gen = torch.Generator(device=DEV).manual_seed(3)
    lens = [1, 15, 16, 17, 300, 1029]
    nb = [-(-n // BS) for n in lens]
    res = {}
    for kind in kinds:
        cache = KVCache(1, sum(nb) + 3, BS, 8, HD, torch.bfloat16, kind, DEV)
        scales = None if cache.scales is None else cache.scales[0]
        perm = torch.randperm(sum(nb) + 3, device=DEV, generator=gen).to(torch.int32)
        tables = torch.zeros(len(lens), max(nb), dtype=torch.int32, device=DEV)
        slots_of = []
        for i, n in enumerate(lens):
            first = sum(nb[:i])
            tables[i, :nb[i]] = perm[first:first + nb[i]]
            pos = torch.arange(n, device=DEV)
            slots_of.append(tables[i, pos // BS].long() * BS + pos % BS)  # [n]
            kv = torch.randn(n, 2, 8, HD, device=DEV, generator=gen, dtype=torch.bfloat16)
            triton_attention.store_kv(kv[:, 0], kv[:, 1], slots_of[i], cache.data[0], scales,
                                      kind, BS)
        q = torch.randn(len(lens), 32, HD, device=DEV, generator=gen, dtype=torch.bfloat16)
        out = torch.empty_like(q)
        ctx = torch.tensor(lens, dtype=torch.int32, device=DEV)
        worst = 0.0
        for splits in (1, 4):
            triton_attention.paged_decode(q, cache.data[0], scales, tables, ctx, out,
                                          HD ** -0.5, BS, kind, splits)
            for i, slots in enumerate(slots_of):
                kv = cache.gather(0, slots).float()  # [n, 2, 8, hd]
                qg = q[i].float().view(8, 4, HD)  # [kvh, group, hd]
                w = torch.softmax(torch.einsum("hgd,nhd->hgn", qg, kv[:, 0]) * HD ** -0.5, -1)
                ref = torch.einsum("hgn,nhd->hgd", w, kv[:, 1]).reshape(32, HD)
                worst = max(worst, (out[i].float() - ref).abs().max().item())
        res[kind] = worst
    return res


def _causal_flops(lens: list[int]) -> float:
    return 4.0 * HD * H * sum(n * (n + 1) / 2 for n in lens)


def bench_prefill(shapes: list[tuple[int, int]], sweep: bool) -> list[dict]:
    """shapes: (sequences, tokens each), no cached prefix."""
    gen = torch.Generator(device=DEV).manual_seed(1)
    rows = []
    for nseq, n in shapes:
        lens = [n] * nseq
        cache, _, tables = _paged(nseq, n, "auto", gen)
        T = nseq * n
        q = torch.randn(T, H, HD, dtype=torch.bfloat16, device=DEV, generator=gen)
        out = torch.empty_like(q)
        ctx = torch.tensor(lens, dtype=torch.int32, device=DEV)
        starts = torch.arange(0, T + 1, n, dtype=torch.int32, device=DEV)
        flops = _causal_flops(lens)
        configs = [{}]
        if sweep and n >= 4096:
            configs += [dict(block_m=bm, block_n=bn, num_warps=w, num_stages=s)
                        for bm, bn, w, s in ((128, 64, 8, 3), (128, 128, 8, 2), (64, 64, 4, 2),
                                             (64, 64, 4, 3), (128, 32, 4, 2), (64, 128, 4, 2))]
        for cfg in configs:
            fn = partial(triton_attention.paged_prefill,
                         q, cache, None, tables, ctx, starts, out, HD ** -0.5, BS, "auto", **cfg)
            ms = triton.testing.do_bench(fn, warmup=20, rep=100)
            rows.append({"impl": "triton_paged", "seqs": nseq, "tokens": n, **cfg,
                         "us": ms * 1e3, "tflop_s": flops / (ms * 1e-3) / 1e12})
        # the same attention, contiguous [B, H, n, hd], through SDPA's flash kernel
        qc = torch.randn(nseq, H, n, HD, dtype=torch.bfloat16, device=DEV, generator=gen)
        kc, vc = torch.randn_like(qc), torch.randn_like(qc)
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            ms = triton.testing.do_bench(
                partial(F.scaled_dot_product_attention, qc, kc, vc, is_causal=True),
                warmup=20, rep=100)
        rows.append({"impl": "sdpa_flash", "seqs": nseq, "tokens": n, "us": ms * 1e3,
                     "tflop_s": flops / (ms * 1e-3) / 1e12})
        del cache, qc, kc, vc
        torch.cuda.empty_cache()
    return rows


class _Steps:
    """Step observer: durations grouped by (prefill tokens, decode tokens)."""

    def __init__(self) -> None:
        self.by_shape: dict[tuple[int, int], list[float]] = {}

    def __call__(self, s: StepStats) -> None:
        self.by_shape.setdefault((s.num_prefill_tokens, s.num_decode_tokens),
                                 []).append(s.duration_s)

    def worst_over_median(self) -> dict:
        worst = {}
        for (p, d), ts in self.by_shape.items():
            if len(ts) >= 5:
                worst[f"prefill={p},decode={d}"] = max(ts) / statistics.median(ts)
        return worst


def _prompts(n: int, length: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, 30000, (n, length), generator=g).tolist()


def _submit(engine: LLMEngine, tag: str, batch: int, prompt: int, out: int, seed: int) -> None:
    """Add ``batch`` greedy requests of ``prompt`` random tokens and ``out`` forced outputs."""
    params = SamplingParams(max_tokens=out, temperature=0.0, ignore_eos=True)
    for i, p in enumerate(_prompts(batch, prompt, seed)):
        engine.add_request(f"{tag}{seed}-{i}", p, params)


def _decode_ms(engine: LLMEngine, batch: int, prompt: int, out: int, seed: int) -> float:
    """Median decode-step time with all ``batch`` sequences decoding (prefill steps, and
    steps after the first sequence finished, excluded). ``out`` must outlast the batch's
    prefill: the first prompt prefilled decodes while the others still prefill."""
    _submit(engine, "r", batch, prompt, out, seed)
    times = []
    while engine.has_unfinished():
        running = engine.scheduler.running
        full = not engine.scheduler.waiting and len(running) == batch and all(
            s.num_computed >= len(s) - 1 for s in running)
        torch.cuda.synchronize()
        t = time.perf_counter()
        engine.step()
        torch.cuda.synchronize()
        if full:
            times.append(time.perf_counter() - t)
    if len(times) < 5:
        raise RuntimeError(f"only {len(times)} steps with all {batch} sequences decoding: "
                           "ask for more output tokens")
    return statistics.median(times[2:]) * 1e3


def _outlasting_prefill(batch: int, prompt: int, out: int, step_tokens: int) -> int:
    """Output tokens per request so that ``out`` steps run with the whole batch decoding
    (a prefill step of ``step_tokens`` also advances the decodes already running)."""
    return out + -(-batch * prompt // step_tokens) + 2


def _stream_tpot_ms(engine: LLMEngine, batch: int, prompt: int, out: int, seed: int) -> float:
    """TPOT as a client sees it, with no device sync between steps (so the overlap of
    async scheduling counts): per request (t_last - t_first) / (tokens - 1) from the
    times its outputs leave ``step()``; the median over requests."""
    _submit(engine, "s", batch, prompt, out, seed)
    first: dict[str, float] = {}
    last: dict[str, tuple[float, int]] = {}
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter()
        for o in outputs:
            if o.new_token_ids:
                first.setdefault(o.request_id, now)
                n = last.get(o.request_id, (0.0, 0))[1] + len(o.new_token_ids)
                last[o.request_id] = (now, n)
    return statistics.median((t - first[r]) / (n - 1) for r, (t, n) in last.items()) * 1e3


def _steady_step_ms(engine: LLMEngine, batch: int, prompt: int, out: int, seed: int) -> float:
    """Decode-step time as clients see it once the whole batch decodes: the median gap
    between consecutive ``step()`` returns that each hand every one of the ``batch``
    requests a token, with no device sync between steps (the host's work for step N+1
    overlaps step N's kernels, as in serving). A client's TPOT in steady state."""
    _submit(engine, "q", batch, prompt, out, seed)
    gaps, last = [], None
    while engine.has_unfinished():
        outputs = engine.step()
        now = time.perf_counter()
        full = sum(1 for o in outputs if o.new_token_ids) == batch
        if full and last is not None:
            gaps.append(now - last)
        last = now if full else None
    if len(gaps) < 5:
        raise RuntimeError(f"only {len(gaps)} steps gave all {batch} requests a token: "
                           "ask for more output tokens")
    return statistics.median(gaps[2:]) * 1e3


def _ttft_ms(engine: LLMEngine, repeats: int = 5) -> tuple[float, list[float]]:
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    times = []
    for r in range(repeats):
        p = _prompts(1, 512, 200 + r)
        torch.cuda.synchronize()
        t = time.perf_counter()
        engine.generate(p, one)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times), times


def _kernels_per_decode_step(engine: LLMEngine) -> int:
    """GPU kernels (and copies) of one batch-1 decode step run eagerly (graphs set aside)."""
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request("profiled", _prompts(1, 16, 5)[0], params)
    engine.step()  # the prefill
    graphs, engine.runner.graphs = engine.runner.graphs, None
    try:
        count = count_gpu_ops(engine.step)
    finally:
        engine.runner.graphs = graphs
    while engine.has_unfinished():
        engine.step()
    return count


def bench_step_op_costs(tokens: tuple[int, ...] = (1, 64, 512), calls: int = 200) -> dict:
    """Host and device microseconds per call of each eager and fused step op on Llama-2-7B
    widths: host = the time to return from a burst of launches (no sync), device = the burst
    until synchronised, both divided by the number of calls."""
    hidden, heads, hd, inter = 4096, 64, 128, 11008  # q + k heads rotated
    res: dict = {}
    for t in tokens:
        x = torch.randn(t, hidden, device=DEV, dtype=torch.bfloat16)
        r, w = torch.randn_like(x), torch.randn(hidden, device=DEV, dtype=torch.bfloat16)
        qkv = torch.randn(t, (heads + 32) * hd, device=DEV, dtype=torch.bfloat16)
        qk = qkv[:, : heads * hd].view(t, heads, hd)
        cos = torch.randn(t, hd, device=DEV, dtype=torch.bfloat16)
        sin = torch.randn_like(cos)
        gu = torch.randn(t, 2 * inter, device=DEV, dtype=torch.bfloat16)
        for ops in (fused_ops.EAGER, fused_ops.TRITON):
            calls_of = {"add_rms_norm": partial(ops.add_rms_norm, x, r, w, 1e-5),
                        "rope": partial(ops.rope_, qk, cos, sin),
                        "silu_mul": partial(ops.silu_mul, gu)}
            for name, fn in calls_of.items():
                fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(calls):
                    fn()
                host = time.perf_counter() - t0
                torch.cuda.synchronize()
                total = time.perf_counter() - t0
                res[f"{ops.name}/{name}/T={t}"] = {"host_us": host / calls * 1e6,
                                                   "device_us": total / calls * 1e6}
    return res


def bench_engine(attention: str, long_context: bool, step_ops: str | None = None,
                 async_scheduling: bool | None = None, kv_cache_dtype: str = "auto",
                 weights_dtype: str = "auto") -> dict:
    """long_context: also the max_model_len 32k engine (the dense references would gather
    32k positions per sequence and layer there: triton only). step_ops: eager / triton /
    compile (None = the engine's default). async_scheduling: the engine setting (None = its
    default, on for CUDA)."""
    source = synthetic_source("llama-2-7b")
    steps = _Steps()
    res: dict = {"kv_cache_dtype": kv_cache_dtype, "weights_dtype": weights_dtype}
    common = dict(device="cuda", dtype="bfloat16", attention=attention,
                  enable_prefix_caching=False, kv_cache_memory_gib=24,
                  async_scheduling=async_scheduling, kv_cache_dtype=kv_cache_dtype,
                  weights_dtype=weights_dtype,
                  **(STEP_OPS_FIELDS[step_ops] if step_ops else {}))
    t0 = time.perf_counter()
    engine = LLMEngine(EngineConfig(max_model_len=1024, max_num_seqs=64, **common), source,
                       step_observer=steps)
    res["engine_build_s"] = time.perf_counter() - t0
    res["weight_bytes"] = sum(t.numel() * t.element_size() for t in
                              engine.runner.model.state_dict().values())
    cfg = source.config
    # K/V bytes one cached token costs across all layers (scales included when quantised)
    res["kv_bytes_per_token"] = bytes_per_block(
        cfg.num_hidden_layers, 1, cfg.num_key_value_heads, cfg.head_dim, kv_cache_dtype,
        torch.bfloat16)
    stats = engine.stats()
    res["compile"] = stats.compile
    res["kernel"] = stats.attention_kernel
    res["async_scheduling"] = stats.async_scheduling
    res["decode_kernels_per_step"] = stats.decode_kernels_per_step
    warm = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    for n in (3, 1):  # first shapes: allocator, cuBLAS heuristics
        engine.generate(_prompts(n, 512, 90 + n), warm)
    steps.by_shape.clear()
    res["ttft_512_ms"], res["ttft_512_all_ms"] = _ttft_ms(engine)
    graphs = engine.runner.graphs
    if graphs is not None and graphs.prefill_tokens:
        res["cuda_graphs"] = graphs.describe()
        # the same engine with its prefill steps run eagerly (no bucket holds them)
        buckets, graphs.prefill_tokens = graphs.prefill_tokens, []
        res["ttft_512_eager_prefill_ms"], _ = _ttft_ms(engine)
        graphs.prefill_tokens = buckets
    res["tpot_batch1_ms"] = _decode_ms(engine, 1, 512, 64, 1)
    res["tpot_batch64_ms"] = _decode_ms(engine, 64, 512, 64, 2)
    res["tok_s_batch64"] = 64 / res["tpot_batch64_ms"] * 1e3
    res["stream_tpot_batch1_ms"] = _stream_tpot_ms(engine, 1, 512, 64, 5)
    res["stream_tpot_batch64_ms"] = _stream_tpot_ms(engine, 64, 512, 64, 6)
    # every prompt prefilled first (the 64 prompts' chunks would otherwise share the first
    # decode steps): context 512 + the decoded tokens, about 544 in the middle
    res["steady_step_batch64_ms"] = _steady_step_ms(
        engine, 64, 512, _outlasting_prefill(64, 512, 64, engine.config.max_num_batched_tokens),
        8)
    res["steady_tok_s_batch64"] = 64 / res["steady_step_batch64_ms"] * 1e3
    res["step_ms_batch32_ctx512_max_len_1k"] = _decode_ms(engine, 32, 480, 64, 3)
    res["worst_step_over_median"] = steps.worst_over_median()
    if step_ops:
        res["kernels_per_decode_step_eager"] = _kernels_per_decode_step(engine)
        greedy = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
        res["greedy_tokens"] = engine.generate(_prompts(1, 64, 7), greedy)[0]
    del engine
    torch.cuda.empty_cache()
    if long_context:
        # Llama-2's preset stops at 4k positions; the cost under test does not depend on
        # them, so the same shapes with a longer RoPE table
        cfg = source.config.model_copy(update={"max_position_embeddings": 32768})
        long = LLMEngine(EngineConfig(max_model_len=32768, max_num_seqs=32, **common),
                         dataclasses.replace(source, config=cfg))
        res["step_ms_batch32_ctx512_max_len_32k"] = _decode_ms(long, 32, 480, 64, 3)
        res["ratio_32k_over_1k"] = (res["step_ms_batch32_ctx512_max_len_32k"]
                                    / res["step_ms_batch32_ctx512_max_len_1k"])
        del long
        torch.cuda.empty_cache()
    return res


def bench_engine_kv(kinds: list[str]) -> dict:
    """ms per decode step at batch 32, context about 4k, by KV cache dtype (triton): the
    engine-level view of the quantised decode (64 x 4k would not fit a bf16 cache)."""
    source = synthetic_source("llama-2-7b")
    res = {}
    for kind in kinds:
        engine = LLMEngine(EngineConfig(
            device="cuda", dtype="bfloat16", attention="triton", enable_prefix_caching=False,
            kv_cache_memory_gib=72, max_model_len=4096, max_num_seqs=32,
            kv_cache_dtype=kind), source)
        res[kind] = _decode_ms(engine, 32, 4000, _outlasting_prefill(
            32, 4000, 64, engine.config.max_num_batched_tokens), 4)
        del engine
        torch.cuda.empty_cache()
    return res


SECTIONS = ("decode", "prefill", "engine", "engine_kv")
_ASYNC = {"default": None, "on": True, "off": False}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma-separated subset of {', '.join(SECTIONS)}")
    ap.add_argument("--sweep", action="store_true", help="also time other tile configs")
    ap.add_argument("--decode-grid", default="1,8,64:512,4096,32768:auto,int8,fp8_e4m3",
                    help="decode section: batches:contexts:KV dtypes")
    ap.add_argument("--engine-kv", default="auto,int8",
                    help="engine_kv section: the KV dtypes to run")
    ap.add_argument("--engine-backends", default="triton,sdpa")
    ap.add_argument("--step-ops", default="",
                    help="engine section: triton attention once per listed way of running "
                         "the work between attention calls (eager,triton,compile)")
    ap.add_argument("--engine-async", default="default",
                    help="comma-separated engine async_scheduling settings to run: "
                         "default, on, off (e.g. off,on for the comparison)")
    ap.add_argument("--engine-kv-dtypes", default="auto",
                    help="engine section: the KV cache dtypes to run it with (auto,int8)")
    ap.add_argument("--engine-weights-dtypes", default="auto",
                    help="engine section: the linear weights to run it with (auto,fp8)")
    ap.add_argument("--skip-long-context", action="store_true",
                    help="no max_model_len 32k engine in the engine section")
    args = ap.parse_args(argv)
    sections = set(args.sections.split(","))
    res = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "triton": triton.__version__, "date": time.strftime("%Y-%m-%d %H:%M")}
    res["copy_gb_s"] = copy_bandwidth() / 1e9
    # each section is saved as soon as it is done: a later failure keeps the earlier ones
    if "decode" in sections:
        batches, contexts, kinds = args.decode_grid.split(":")
        quantised = [k for k in kinds.split(",") if k != "auto"]
        res["decode_check_max_abs_diff"] = check_quantised_decode(["auto", *quantised])
        _save(res, args.json)
        res["decode"] = bench_decode([int(b) for b in batches.split(",")],
                                     [int(c) for c in contexts.split(",")], kinds.split(","),
                                     args.sweep)
        _save(res, args.json)
    if "prefill" in sections:
        res["prefill"] = bench_prefill([(1, 512), (8, 512), (1, 4096), (4, 4096)], args.sweep)
        _save(res, args.json)
    if "engine" in sections:
        res["engine"] = {}
        if args.step_ops:
            res["step_op_costs_us"] = bench_step_op_costs()
        for ops in filter(None, args.step_ops.split(",")):
            res["engine"][f"triton+{ops}"] = bench_engine("triton", False, ops)
            _save(res, args.json)
        modes = args.engine_async.split(",")
        for b in filter(None, args.engine_backends.split(",")):
            for mode, kv, wd in itertools.product(modes, args.engine_kv_dtypes.split(","),
                                                  args.engine_weights_dtypes.split(",")):
                key = b if mode == "default" else f"{b}_async_{mode}"
                key += "" if kv == "auto" else f"_kv_{kv}"
                key += "" if wd == "auto" else f"_weights_{wd}"
                res["engine"][key] = bench_engine(
                    b, long_context=b == "triton" and not args.skip_long_context
                    and kv == "auto" and wd == "auto",
                    async_scheduling=_ASYNC[mode], kv_cache_dtype=kv, weights_dtype=wd)
                _save(res, args.json)
    if "engine_kv" in sections:
        res["engine_step_ms_batch32_ctx4k_by_kv"] = bench_engine_kv(args.engine_kv.split(","))
    emit_json(res, args.json)
    _summary(res)


def _save(res: dict, path: Path | None) -> None:
    if path:
        path.write_text(json.dumps(res, indent=2) + "\n")


def _summary(res: dict) -> None:
    copy = res["copy_gb_s"]
    print(f"copy {copy:.0f} GB/s")
    if "decode_check_max_abs_diff" in res:
        print("decode vs dequantised reference, max |diff|:", res["decode_check_max_abs_diff"])
    for r in res.get("decode", []):
        extra = {k: r[k] for k in ("block_n", "num_warps", "num_stages",
                                   "max_abs_diff_vs_default") if k in r}
        print(f"decode {r['kv']:9s} B={r['batch']:3d} ctx={r['context']:6d} "
              f"splits={r['num_splits']:2d} {r['us']:9.1f} us {r['gb_s']:7.0f} GB/s "
              f"({r['gb_s'] / copy:.0%} of copy) {extra or ''} "
              f"{r.get('us_in_cuda_graph_l2_warm', '')}")
    for r in res.get("prefill", []):
        print(f"prefill {r['impl']:13s} {r['seqs']}x{r['tokens']} {r['us']:9.1f} us "
              f"{r['tflop_s']:6.1f} TFLOP/s {r.get('block_m', '')} {r.get('block_n', '')}")
    for b, e in res.get("engine", {}).items():
        print(b, {k: v for k, v in e.items() if not isinstance(v, (list, dict))})
        if "weight_bytes" in e:
            print(f"  floor at batch 1: {e['weight_bytes'] / (copy * 1e9) * 1e3:.2f} ms "
                  f"(weight bytes / copy bandwidth)")
        if "kv_bytes_per_token" in e:
            kv = 64 * 544 * e["kv_bytes_per_token"]
            print(f"  floor at batch 64, context 544: "
                  f"{(e['weight_bytes'] + kv) / (copy * 1e9) * 1e3:.2f} ms "
                  f"(weights + {kv / 1e9:.1f} GB of K/V) / copy bandwidth")
    for k, v in res.get("step_op_costs_us", {}).items():
        print(f"{k:28s} host {v['host_us']:7.1f} us  device {v['device_us']:7.1f} us")
    tokens = {b: e["greedy_tokens"] for b, e in res.get("engine", {}).items()
              if "greedy_tokens" in e}
    if tokens:
        first = next(iter(tokens.values()))
        print("greedy tokens equal to the first variant's:",
              {b: sum(x == y for x, y in zip(t, first)) for b, t in tokens.items()}, "of",
              len(first))
    if "engine_step_ms_batch32_ctx4k_by_kv" in res:
        print("engine ms/step batch 32 ctx 4k by KV dtype",
              res["engine_step_ms_batch32_ctx4k_by_kv"])


if __name__ == "__main__":
    main()
