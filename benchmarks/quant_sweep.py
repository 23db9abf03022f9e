"""One-GPU-call sweep of the weight-only int8 / int4 kernels on Llama-2-7B's linear shapes.

For each shape, token count (1 = GEMV, 64 = GEMM) and format it times every kernel variant
below (tile shapes, warps, the MAGIC code decoding, split-K), torch's own CUDA kernels where
they exist (tinygemm ``_weight_int4pack_mm``; ``_weight_int8pack_mm`` took 1.6 ms per
Llama block at M = 1 in a first sweep and is left out), cuBLAS bf16 and the
device-to-device copy bandwidth, all in the same process; checks each output against the
dequantised reference; picks per format and token count the variant with the least time
summed over the four shapes (one Llama block); then, with those picks installed in
``quant_kernels.CONFIGS``, runs the engine (``benchmarks.quant.engine_level``) per format.

    python -m benchmarks.quant_sweep --json-dir OUT [--budget-s 160] [--engine bf16,int8,...]

Variants compile in parallel worker processes first (they fill Triton's disk cache), so the
timing loop loads them ready. ``--smoke`` runs a few tiny shapes on the CPU under
``TRITON_INTERPRET=1`` (plumbing only: its times mean nothing).
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from backend.layers import quant_kernels as qk
from backend.layers.quantize import quantize_int4, quantize_int8
from benchmarks.quant import copies_past_l2, engine_level, rel_err, time_rotating

SHAPES_7B = (("qkv", 12288, 4096), ("o", 4096, 4096), ("gate_up", 22016, 4096),
             ("down", 4096, 11008))
SHAPES_SMOKE = (("a", 64, 256), ("b", 48, 512))
FORMATS = ("int8", "int4-g32", "int4-g128")
# the sweeps in docs/benchmarks/quant.md rotated 240 MB (the other benchmarks: ROTATE_BYTES)
SWEEP_ROTATE_BYTES = 240 << 20


def _v(kind: str, **kw) -> dict:
    kw.setdefault("num_stages", 3)
    return {"kind": kind, **kw}


# Word-wise GEMV variants: (BLOCK_N, BLOCK_K for int8 / BYTES for int4, num_warps, STAGES =
# pipelined weight loads, PROGRAMS_PER_SM = the grid's minimum, SPLIT_GEMV = make it up by
# splitting K rather than by halving the rows per program).
WORDS_INT8 = ((8, 1024, 4, 1, 0, 0), (8, 1024, 4, 2, 0, 0), (8, 1024, 4, 3, 0, 0),
              (16, 512, 4, 1, 0, 0), (16, 512, 4, 3, 0, 0), (16, 1024, 8, 1, 0, 0),
              (16, 1024, 8, 3, 0, 0), (8, 2048, 8, 3, 0, 0), (32, 256, 4, 3, 0, 0),
              (4, 2048, 4, 3, 0, 0), (16, 1024, 8, 3, 2, 1), (32, 512, 8, 3, 2, 1),
              (16, 512, 4, 3, 4, 1), (8, 1024, 4, 3, 4, 1), (8, 1024, 4, 1, 4, 1),
              (32, 256, 4, 3, 4, 1))
WORDS_INT4 = ((16, 512, 4, 1, 0, 0), (16, 512, 4, 3, 0, 0), (32, 256, 4, 1, 0, 0),
              (32, 256, 4, 2, 0, 0), (32, 256, 4, 3, 0, 0), (32, 512, 8, 3, 0, 0),
              (16, 1024, 8, 3, 0, 0), (64, 128, 4, 3, 0, 0), (8, 1024, 4, 3, 0, 0),
              (32, 256, 4, 3, 2, 1), (32, 256, 4, 3, 4, 1), (32, 256, 4, 1, 4, 1),
              (16, 512, 4, 3, 4, 1), (32, 512, 8, 3, 2, 1), (64, 128, 4, 3, 2, 1),
              (64, 256, 8, 3, 2, 1), (16, 512, 4, 1, 4, 1), (16, 256, 4, 3, 4, 1),
              (64, 128, 2, 1, 4, 1), (64, 128, 2, 3, 4, 1), (32, 128, 1, 3, 8, 1))


def _words(size_key: str, rows) -> list[dict]:
    """The word-wise GEMV configs of a table above; ``size_key`` names its second column."""
    return [_v("triton", MAGIC=1, WORDS=1, BLOCK_N=bn, **{size_key: size}, num_warps=w,
               STAGES=st, PROGRAMS_PER_SM=p, SPLIT_GEMV=sp)
            for bn, size, w, st, p, sp in rows]


def variants(fmt: str, M: int) -> list[dict]:
    """Every kernel configuration tried for ``fmt`` at ``M`` tokens. GEMV configs carry
    MAGIC (int8) or BYTES (int4); the others run the GEMM (at M = 1 padded to 16 rows)."""
    if fmt == "int8" and M == 1:
        out = [_v("triton", BLOCK_N=bn, BLOCK_K=bk, num_warps=w, MAGIC=m)
               for bn, bk, w, m in ((8, 1024, 4, 1), (16, 512, 4, 1), (8, 512, 4, 1))]
        out += _words("BLOCK_K", WORDS_INT8)
        out += [_v("triton", BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=st,
                   **extra)
                for bn, bk, sk, w, st, extra in ((64, 128, 0, 4, 4, {}),)]
        return out
    if fmt == "int8":
        return [_v("triton", BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=st,
                   **extra)
                for bn, bk, sk, w, st, extra in (
                    (64, 64, 0, 4, 5, {}), (128, 64, 0, 4, 4, {}), (64, 128, 0, 4, 4, {}),
                    (64, 64, 2, 4, 5, {}), (64, 64, 0, 4, 5, dict(SPLIT_TARGET=2)),
                    (64, 64, 0, 4, 5, dict(SPLIT_TARGET=3)),
                    (128, 64, 0, 4, 4, dict(SPLIT_TARGET=2)),
                    (64, 128, 0, 4, 4, dict(SPLIT_TARGET=2)),
                    (64, 128, 0, 4, 4, dict(SWAP=1)), (128, 128, 0, 8, 3, dict(SWAP=1)))]
    G = int(fmt.split("g")[1])
    if M == 1:
        out = [_v("triton", BLOCK_N=bn, BYTES=by, num_warps=w, MAGIC=m)
               for bn, by, w, m in ((2, 1024, 4, 1), (8, 512, 4, 1), (4, 1024, 4, 1))]
        out += _words("BYTES", WORDS_INT4)
        out += [_v("triton", BLOCK_N=64, GROUPS=1, SPLIT_K=sk, MAGIC=m, num_warps=4, SWAP=1)
                for sk, m in ((0, 3), (4, 3))]  # the GEMM, 16 rows padded
    else:
        rows = [(64, 1, 0, 3, 4, 3, 1, 1), (64, 1, 0, 0, 4, 3, 1, 1),
                (64, 1, 2, 3, 4, 3, 1, 1), (64, 1, 0, 3, 4, 4, 1, 1),
                (64, 1, 0, 3, 4, 3, 1, 2), (64, 1, 0, 3, 4, 3, 1, 3),
                (128, 1, 0, 3, 8, 3, 1, 1), (128, 1, 0, 3, 8, 3, 1, 2),
                (32, 1, 0, 3, 4, 3, 1, 2)]
        if G == 32:
            rows += [(64, 2, 0, 3, 4, 3, 1, 1), (64, 2, 0, 3, 4, 3, 1, 2)]
        out = [_v("triton", BLOCK_N=bn, GROUPS=gr, SPLIT_K=sk, MAGIC=m, num_warps=w,
                  num_stages=st, SWAP=sw, SPLIT_TARGET=tg)
               for bn, gr, sk, m, w, st, sw, tg in rows]
        # stream-K (STREAM_K programs per multiprocessor): (BLOCK_N, GROUPS, warps, stages)
        # (shapes with fewer tiles than multiprocessors run the tile grid, SPLIT_TARGET 1)
        out += [_v("triton", BLOCK_N=bn, GROUPS=gr, SPLIT_K=0, MAGIC=3, num_warps=w,
                   num_stages=st, SWAP=1, SPLIT_TARGET=1, STREAM_K=p)
                for bn, gr, w, st, p in ((64, 1, 4, 3, 1), (64, 1, 4, 3, 2), (64, 1, 4, 2, 2),
                                         (64, 1, 4, 2, 3), (128, 1, 8, 3, 1),
                                         (64, 2, 4, 3, 2))]
    return out + [_v("tinygemm", inner_k_tiles=t) for t in ((2, 8) if M == 1 else (8,))]


def _name(v: dict) -> str:
    return v["kind"] + "".join(f" {k}={val}" for k, val in v.items() if k != "kind")


def _config(v: dict) -> dict:
    return {k: val for k, val in v.items() if k != "kind"}


class Weights:
    """One shape's weight in every format (codes, scales, packed layouts), and copies of the
    codes to rotate through (``calls``)."""

    def __init__(self, N: int, K: int, device: torch.device, seed: int = 0) -> None:
        gen = torch.Generator(device=device).manual_seed(seed)
        w = torch.randn(N, K, device=device, generator=gen) * 0.02
        self.bf16 = w.to(torch.bfloat16)
        self.dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        q, s = quantize_int8(w)
        self.q, self.s = q, s.to(self.dtype)
        self.ref = {"int8": q.float() * self.s.float()[:, None]}
        self.int4 = {}
        for G in (32, 128):
            g = quantize_int4(w, G)
            packed = qk.pack_int4(g.codes)
            scale, lo = g.scale.to(self.dtype), g.min.to(self.dtype)
            sm = qk.pack_scale_min(scale, lo)
            self.int4[G] = (g.codes, packed, scale, lo, sm)
            self.ref[f"int4-g{G}"] = qk.dequantize_int4(packed, sm, G).float()
        del w
        self._tiny: dict = {}
        self._copies: dict = {}

    def calls(self, fmt: str, v: dict, x: torch.Tensor) -> list:
        """Zero-argument calls of variant ``v`` on x, one per copy of the codes: enough
        copies that the calls in turn read ``SWEEP_ROTATE_BYTES`` (none from L2);
        one call off CUDA. Raises if the variant cannot run."""
        if fmt == "int8":
            return [partial(qk.int8_matmul, x, q, self.s, _config(v))
                    for q in self._rotated("int8", self.q)]
        G = int(fmt.split("g")[1])
        codes, packed, scale, lo, sm = self.int4[G]
        if v["kind"] == "tinygemm":
            key = (G, v["inner_k_tiles"])
            if key not in self._tiny:
                # tinygemm: W = (q - 8) * scale + zero, two codes a byte, high nibble first.
                c = codes.to(torch.int32)
                u8 = ((c[:, ::2] << 4) | c[:, 1::2]).to(torch.uint8)
                wp = torch.ops.aten._convert_weight_to_int4pack(u8, v["inner_k_tiles"])
                sz = torch.stack([scale, lo + 8 * scale], dim=-1).transpose(0, 1).contiguous()
                self._tiny[key] = (wp, sz)
            wp, sz = self._tiny[key]
            return [partial(torch.ops.aten._weight_int4pack_mm, x, p, G, sz)
                    for p in self._rotated(key, wp)]
        # scales rotated with the codes: the engine reads both from memory
        return [partial(qk.int4_matmul, x, p, s, G, _config(v))
                for p, s in zip(self._rotated(G, packed), self._rotated((G, "sm"), sm, packed))]

    def bf16_calls(self, x: torch.Tensor) -> list:
        """cuBLAS on x, one call per copy of the bf16 weight (as ``calls``)."""
        return [partial(F.linear, x, w.to(self.dtype)) for w in self._rotated("bf16", self.bf16)]

    def _rotated(self, key, codes: torch.Tensor, like: torch.Tensor | None = None
                 ) -> list[torch.Tensor]:
        """Copies of ``codes``: as many as ``like``'s (default: its own) size asks for."""
        if key not in self._copies:
            sized = codes if like is None else like
            n = 1 if codes.device.type != "cuda" else copies_past_l2(
                sized.numel() * sized.element_size(), SWEEP_ROTATE_BYTES)
            self._copies[key] = [codes] + [codes.clone() for _ in range(n - 1)]
        return self._copies[key]


def copy_gbs(device: torch.device) -> float:
    """Device-to-device copy of 2 GiB: (bytes read + written) / time, median of 5."""
    if device.type != "cuda":
        return 0.0
    a = torch.empty(2 << 30, dtype=torch.uint8, device=device)
    a.random_()
    b = torch.empty_like(a)
    b.copy_(a)
    times = []
    for _ in range(5):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        b.copy_(a)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / 1e3)
    del a, b
    torch.cuda.empty_cache()
    return round(2 * (2 << 30) / statistics.median(times) / 1e9, 1)


def _warm_worker(args: tuple) -> list[str]:
    """Compile a slice of the variants (first call of each on every shape) in a separate
    process; Triton's disk cache hands the binaries to the timing process."""
    shapes, jobs, smoke = args
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float32 if smoke else torch.bfloat16
    errors = []
    for _, N, K in shapes:
        q = torch.randint(-127, 127, (N, K), dtype=torch.int8, device=device)
        s = torch.rand(N, device=device, dtype=dtype)
        packed = torch.randint(0, 255, (N, K // 2), dtype=torch.uint8, device=device)
        for fmt, M, v in jobs:
            if v["kind"] != "triton":
                continue
            x = torch.randn(M, K, device=device, dtype=dtype)
            try:
                if fmt == "int8":
                    qk.int8_matmul(x, q, s, _config(v))
                else:
                    G = int(fmt.split("g")[1])
                    sc = torch.rand(N, K // (2 * G), 4, device=device, dtype=dtype)
                    qk.int4_matmul(x, packed, sc, G, _config(v))
            except Exception as exc:  # the timing pass reports it per variant
                errors.append(f"{fmt} M={M} {_name(v)}: {exc!r}"[:300])
    if not smoke:
        torch.cuda.synchronize()
    return errors


def precompile(shapes, Ms, smoke: bool, workers: int, formats=FORMATS) -> list[str]:
    jobs = [(fmt, M, v) for fmt in formats for M in Ms for v in variants(fmt, M)]
    chunks = [jobs[i::workers] for i in range(workers)]
    if smoke:  # the warm-up's plumbing on one shape: the timed pass runs every variant
        return _warm_worker((shapes[:1], jobs, smoke))
    with mp.get_context("spawn").Pool(workers) as pool:
        return [e for errs in pool.map(_warm_worker, [(shapes, c, smoke) for c in chunks])
                for e in errs]


def sweep(shapes, Ms, device: torch.device, deadline: float,
          formats=FORMATS) -> list[dict]:
    rows = []
    for name, N, K in shapes:
        wts = Weights(N, K, device)
        for M in Ms:
            if time.perf_counter() > deadline:
                rows.append({"shape": name, "M": M, "skipped": "budget"})
                continue
            x = torch.randn(M, K, device=device, dtype=wts.dtype)
            us = time_rotating(wts.bf16_calls(x), device)
            rows.append({"shape": name, "N": N, "K": K, "M": M, "format": "bf16",
                         "variant": "cuBLAS F.linear", "us": round(us, 2),
                         "weight_bytes": N * K * 2})
            for fmt in formats:
                ref = x.float() @ wts.ref[fmt].t()
                nbytes = N * K if fmt == "int8" else N * K // 2 + 2 * 2 * N * K // int(
                    fmt.split("g")[1])
                nbytes += 2 * N if fmt == "int8" else 0
                for v in variants(fmt, M):
                    row = {"shape": name, "N": N, "K": K, "M": M, "format": fmt,
                           "variant": _name(v), "config": v, "weight_bytes": nbytes}
                    try:
                        calls = wts.calls(fmt, v, x)
                        t = time.perf_counter()
                        err = rel_err(calls[0](), ref)
                        first_us = (time.perf_counter() - t) * 1e6
                        row["rel_err"] = err
                        if not err < 2e-2:
                            row["error"] = "wrong result"
                        else:  # off CUDA (smoke, interpreted) the checked call's own time
                            row["us"] = round(time_rotating(calls, device)
                                              if device.type == "cuda" else first_us, 2)
                    except Exception as exc:  # record and go on with the next variant
                        row["error"] = repr(exc)[:300]
                    rows.append(row)
        del wts
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


PICK_GROUPS = {"int8": ("int8",), "int4": ("int4-g32", "int4-g128"),
               "int4-g32": ("int4-g32",), "int4-g128": ("int4-g128",), "bf16": ("bf16",)}


def pick(rows: list[dict], shapes) -> dict:
    """Per format group and M: every variant's time summed over all shapes (one Llama
    block; "int4" sums both group sizes, which share one table) and the fastest Triton
    variant among those that ran correctly everywhere."""
    out = {}
    for group, fmts in PICK_GROUPS.items():
        need = {(f, s[0]) for f in fmts for s in shapes}
        for M in sorted({r["M"] for r in rows}):
            sums: dict[str, float] = {}
            seen: dict[str, set] = {}
            configs = {}
            for r in rows:
                if r.get("format") in fmts and r["M"] == M and "us" in r:
                    sums[r["variant"]] = sums.get(r["variant"], 0.0) + r["us"]
                    seen.setdefault(r["variant"], set()).add((r["format"], r["shape"]))
                    configs[r["variant"]] = r.get("config")
            full = {k: round(v, 2) for k, v in sums.items() if seen[k] == need}
            triton_only = {k: v for k, v in full.items() if k.startswith("triton")}
            best = min(triton_only, key=triton_only.get) if triton_only else None
            out[f"{group}@{M}"] = {"sums_us": dict(sorted(full.items(), key=lambda kv: kv[1])),
                                   "best_triton": best,
                                   "best_config": configs.get(best) if best else None}
    return out


def install(picks: dict, formats=FORMATS) -> dict:
    """Put the picks into quant_kernels.CONFIGS (the M = 64 pick for every GEMM bucket):
    "int8", "int4" (one table for every group size) and, per group size swept, the
    "int4-g<G>" override; buckets of token counts not swept keep their committed entries.
    Returns what was installed."""
    done = {}
    for table in ("int8", "int4", *(f for f in formats if f.startswith("int4-"))):
        for key, p in picks.items():
            group, M = key.split("@")
            if group != table or not p["best_config"]:
                continue
            cfg = _config(p["best_config"])
            for b in ([1] if M == "1" else [16, 32, 64, 128]):
                qk.CONFIGS.setdefault(table, {})[b] = cfg
            done[key] = cfg
    return done


def summary(rows: list[dict], picks: dict) -> list[str]:
    """One line per shape and M: cuBLAS bf16, each format's picked Triton variant, and the
    best tinygemm time."""
    lines = []
    for M in sorted({r["M"] for r in rows}):
        for shape in dict.fromkeys(r["shape"] for r in rows):
            got = {}
            for r in rows:
                if r["shape"] != shape or r["M"] != M or "us" not in r:
                    continue
                fmt = r["format"]
                # each format's own pick: the one ``install`` puts in its table
                if fmt == "bf16" or r["variant"] == picks.get(f"{fmt}@{M}", {}).get(
                        "best_triton"):
                    got[fmt] = r["us"]
                if r["variant"].startswith("tinygemm"):
                    got["t" + fmt] = min(got.get("t" + fmt, 1e9), r["us"])
            cols = [got.get(k) for k in ("bf16", "int8", "int4-g32", "int4-g128",
                                          "tint4-g32", "tint4-g128")]
            lines.append(f"{shape:8} {M:3} " + " ".join(
                f"{c:6.1f}" if c is not None else "     -" for c in cols))
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json-dir", type=Path, required=True)
    ap.add_argument("--budget-s", type=float, default=160.0)
    ap.add_argument("--sweep-budget-s", type=float, default=100.0)
    ap.add_argument("--engine", default="bf16,int8,int4:32,int4:128")
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--no-install", action="store_true",
                    help="run the engine with the committed CONFIGS, not the sweep's picks")
    ap.add_argument("--formats", default=",".join(FORMATS),
                    help="the formats to sweep (of %(default)s)")
    ap.add_argument("--tokens", default="1,64", help="token counts to sweep")
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args(argv)
    formats = tuple(f for f in args.formats.split(",") if f)
    if not set(formats) <= set(FORMATS):
        ap.error(f"--formats: not among {FORMATS}: {sorted(set(formats) - set(FORMATS))}")
    start = time.perf_counter()
    args.json_dir.mkdir(parents=True, exist_ok=True)
    device = torch.device("cpu" if args.smoke else "cuda")
    shapes = SHAPES_SMOKE if args.smoke else SHAPES_7B
    Ms = tuple(int(m) for m in args.tokens.split(",")) if not args.smoke else (1, 20)
    meta = {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "triton": getattr(qk.triton, "__version__", None),
            "copy_gbs": copy_gbs(device)}
    t = time.perf_counter()
    meta["compile_errors"] = precompile(shapes, Ms, args.smoke, args.workers, formats)
    meta["precompile_s"] = round(time.perf_counter() - t, 1)
    rows = sweep(shapes, Ms, device, start + args.sweep_budget_s, formats)
    picks = pick(rows, shapes)
    meta["sweep_s"] = round(time.perf_counter() - start, 1)
    (args.json_dir / "sweep.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    installed = {} if args.no_install else install(picks, formats)
    (args.json_dir / "picks.json").write_text(json.dumps(
        {"picks": picks, "installed": installed, "configs": qk.CONFIGS}, indent=1))
    engine = {}
    if not args.smoke and args.engine:
        for spec in args.engine.split(","):
            if time.perf_counter() - start > args.budget_s:
                engine[spec] = {"skipped": "budget"}
                continue
            name, _, group = spec.partition(":")
            try:
                engine[spec] = engine_level(name, int(group or 32))
            except Exception as exc:  # one failing format must not lose the rest
                engine[spec] = {"error": repr(exc)[:500]}
            (args.json_dir / "engine.json").write_text(json.dumps(engine, indent=1))
    meta["elapsed_s"] = round(time.perf_counter() - start, 1)
    (args.json_dir / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"copy {meta['copy_gbs']} GB/s  precompile {meta['precompile_s']} s  "
          f"sweep {meta['sweep_s']} s  errors {len(meta['compile_errors'])}")
    for key, p in picks.items():
        top = list(p["sums_us"].items())[:2]
        print(key, "|", " ; ".join(f"{k} {v}" for k, v in top))
    print("shape    M  bf16   int8 int4g32 int4g128 (us, picked)  tinygemm g32/g128 best")
    for line in summary(rows, picks):
        print(line)
    for spec, r in engine.items():
        print(spec, {k: r.get(k) for k in ("step_ms_batch1", "step_ms_batch64", "gpu_mem_gib",
                                            "error", "skipped")})
    print("elapsed", meta["elapsed_s"])


if __name__ == "__main__":
    main()
