"""Ad hoc (2026-12-06): SmolLM2's 29 pairs of layer pieces (``backend.engine.aot_layers``)
eager against compiled ahead of time, by row count. Packages go to /tmp/few-rows-probe/.

    PYTHONPATH=. python probes.py static 1,2,4,8   # one static package per row count
    PYTHONPATH=. python probes.py dynamic LO        # one package, rows a symbol in [LO, 8]
    PYTHONPATH=. python probes.py one-row           # 1 row: static vs dynamic [1, 8]
                                                    # (after static 1 and dynamic 1)
Output of the recorded runs: probes.log.
"""
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.export import Dim

from backend.engine import aot_layers
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.layers import cpu_aot
from backend.weights.loader import load_model_source

DIR = Path("/tmp/few-rows-probe")


def example(model, rows: int) -> tuple[torch.Tensor, ...]:
    cfg, dt = model.cfg, model.dtype
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(rows, cfg.num_attention_heads * cfg.head_dim, generator=gen).to(dt),
            torch.randn(rows, cfg.hidden_size, generator=gen).to(dt),
            model.cos_table[7:7 + rows], model.sin_table[7:7 + rows])


def timed(fn, reps: int = 30) -> float:
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def main() -> None:
    torch.set_num_threads(2)
    DIR.mkdir(exist_ok=True)
    eng = LLMEngine(EngineConfig(device="cpu", prefill_dense_weights="off", max_num_seqs=8,
                                 kv_cache_memory_gib=0.05, max_model_len=256),
                    load_model_source("smollm2-135m-instruct"))
    model = eng.runner.model
    pairs = aot_layers._pairs(model)
    names = sorted(aot_layers._tensors(pairs[0]))
    tensors = aot_layers._tensors(pairs[0])
    ws = [[aot_layers._tensors(p)[n] for n in names] for p in pairs]
    lifted = aot_layers._Lifted(pairs[0], names).eval()

    def all_pairs(run, ex):
        return lambda: [run([*ws[i], *ex]) for i in range(len(pairs))]

    def check(run, ex):
        want, got = pairs[0](*ex), run([*ws[0], *ex])
        return max(cpu_aot.relative_error(g, w) for g, w in zip(got, want))

    mode = sys.argv[1]
    with torch.inference_mode():
        if mode == "static":
            for rows in map(int, sys.argv[2].split(",")):
                ex = example(model, rows)
                path = DIR / f"pair-T{rows}.pt2"
                s = cpu_aot.compile_package(path, lifted, (*(tensors[n] for n in names), *ex))
                run = cpu_aot.load_runner(path)
                eager = timed(lambda: [p(*ex) for p in pairs])
                print(f"T={rows}: eager {eager:.2f} ms  compiled {timed(all_pairs(run, ex)):.2f}"
                      f" ms  (29 pairs)  err {check(run, ex):.3g}  build {s:.1f}s", flush=True)
        elif mode == "dynamic":
            lo = int(sys.argv[2])
            dim = Dim("rows", min=lo, max=8)
            dyn = {"args": (*(None for _ in names), *({0: dim} for _ in range(4)))}
            path = DIR / f"dyn{lo}.pt2"
            s = cpu_aot.compile_package(path, lifted,
                                        (*(tensors[n] for n in names), *example(model, 4)), dyn)
            print("build", s, path.stat().st_size)
            run = cpu_aot.load_runner(path)
            for rows in (r for r in (1, 2, 4, 8) if r >= lo):
                ex = example(model, rows)
                print(f"T={rows}: dynamic {timed(all_pairs(run, ex)):.2f} ms "
                      f"err {check(run, ex):.3g}", flush=True)
        else:  # one-row
            ex = example(model, 1)
            runs = {"static": all_pairs(cpu_aot.load_runner(DIR / "pair-T1.pt2"), ex),
                    "dynamic": all_pairs(cpu_aot.load_runner(DIR / "dyn1.pt2"), ex)}
            t = {k: [] for k in runs}
            for rep in range(200):
                order = list(runs.items())
                for k, fn in (order if rep % 2 else order[::-1]):
                    t[k].append(timed(fn, 1))
            for k, v in t.items():
                print(k, f"median {statistics.median(v):.3f} ms  p10 {sorted(v)[20]:.3f}")
            faster = sum(a > b for a, b in zip(t["static"], t["dynamic"]))
            print("dynamic faster in", faster, "of", len(t["static"]))


if __name__ == "__main__":
    main()
