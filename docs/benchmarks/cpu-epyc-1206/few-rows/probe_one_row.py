"""Ad hoc (2026-12-06): one row through the static one-row package against the dynamic
[1, 8] one, alternating (run probe_static.py 1 and probe_dynamic.py 1 first). See
probes.log."""
import time, statistics, torch
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
gen = torch.Generator().manual_seed(0)
e = (torch.randn(1, cfg.num_attention_heads * cfg.head_dim, generator=gen).to(dt),
     torch.randn(1, cfg.hidden_size, generator=gen).to(dt), model.cos_table[7:8], model.sin_table[7:8])
runs = {"static": cpu_aot.load_runner(Path("/tmp/few-rows-probe/pair-T1.pt2")), "dynamic": cpu_aot.load_runner(Path("/tmp/few-rows-probe/dyn1.pt2"))}
ws = [[aot_layers._tensors(p)[n] for n in names] for p in pairs]
t = {k: [] for k in runs}
with torch.inference_mode():
    for rep in range(200):
        for k, run in (runs.items() if rep % 2 else reversed(list(runs.items()))):
            t0 = time.perf_counter()
            for i in range(len(pairs)): run([*ws[i], *e])
            t[k].append(time.perf_counter() - t0)
for k, v in t.items():
    print(k, f"median {statistics.median(v)*1e3:.3f} ms  p10 {sorted(v)[20]*1e3:.3f}")
print("dynamic faster in", sum(a > b for a, b in zip(t["static"], t["dynamic"])), "of", len(t["static"]))
