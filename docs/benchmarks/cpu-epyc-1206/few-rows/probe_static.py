"""Ad hoc (2026-12-06): the 29 pairs of SmolLM2 layer pieces eager against one static
package per row count (argv[1]: 1,2,4,8). See probes.log."""
import sys, time, statistics, torch, gc
from pathlib import Path
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.weights.loader import load_model_source
from backend.engine import aot_layers
from backend.layers import cpu_aot
torch.set_num_threads(2)
src = load_model_source("smollm2-135m-instruct")
eng = LLMEngine(EngineConfig(device="cpu", prefill_dense_weights="off", max_num_seqs=8, kv_cache_memory_gib=0.05, max_model_len=256), src)
model = eng.runner.model
pairs = aot_layers._pairs(model)
names = sorted(aot_layers._tensors(pairs[0]))
cfg, dt = model.cfg, model.dtype
res = {}
for T in [int(t) for t in sys.argv[1].split(",")]:
    gen = torch.Generator().manual_seed(0)
    ex = (torch.randn(T, cfg.num_attention_heads * cfg.head_dim, generator=gen).to(dt),
          torch.randn(T, cfg.hidden_size, generator=gen).to(dt), model.cos_table[7:7+T], model.sin_table[7:7+T])
    path = Path(f"/tmp/few-rows-probe/pair-T{T}.pt2")
    tensors = aot_layers._tensors(pairs[0])
    s = cpu_aot.compile_package(path, aot_layers._Lifted(pairs[0], names).eval(), (*(tensors[n] for n in names), *ex))
    run = cpu_aot.load_runner(path)
    ws = [[aot_layers._tensors(p)[n] for n in names] for p in pairs]
    with torch.inference_mode():
        want = pairs[0](*ex); got = run([*ws[0], *ex])
        err = max(cpu_aot.relative_error(g, w) for g, w in zip(got, want))
        e, c = [], []
        for rep in range(30):
            t = time.perf_counter()
            for i, p in enumerate(pairs): p(*ex)
            e.append(time.perf_counter() - t)
            t = time.perf_counter()
            for i, p in enumerate(pairs): run([*ws[i], *ex])
            c.append(time.perf_counter() - t)
    res[T] = (statistics.median(e) * 1e3, statistics.median(c) * 1e3, err, s)
    print(f"T={T}: eager {res[T][0]:.2f} ms  compiled {res[T][1]:.2f} ms  (29 pairs)  err {err:.3g}  build {s:.1f}s", flush=True)
