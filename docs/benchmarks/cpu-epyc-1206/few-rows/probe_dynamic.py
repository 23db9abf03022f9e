"""Ad hoc (2026-12-06): the 29 pairs of SmolLM2 layer pieces compiled once with the row
count dynamic in [LO, 8] (argv[1]), timed at 1/2/4/8 rows. See probes.log."""
import sys, time, statistics, torch, os
from pathlib import Path
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.weights.loader import load_model_source
from backend.engine import aot_layers
from backend.layers import cpu_aot
from torch.export import Dim
torch.set_num_threads(2)
src = load_model_source("smollm2-135m-instruct")
eng = LLMEngine(EngineConfig(device="cpu", prefill_dense_weights="off", max_num_seqs=8, kv_cache_memory_gib=0.05, max_model_len=256), src)
model = eng.runner.model
pairs = aot_layers._pairs(model)
names = sorted(aot_layers._tensors(pairs[0]))
tensors = aot_layers._tensors(pairs[0])
cfg, dt = model.cfg, model.dtype
lo = int(sys.argv[1])
def ex(T):
    gen = torch.Generator().manual_seed(0)
    return (torch.randn(T, cfg.num_attention_heads * cfg.head_dim, generator=gen).to(dt),
            torch.randn(T, cfg.hidden_size, generator=gen).to(dt), model.cos_table[7:7+T], model.sin_table[7:7+T])
rows = Dim("rows", min=lo, max=8)
dyn = tuple([None] * len(names) + [{0: rows}] * 4)
from torch._inductor import aoti_compile_and_package
t0 = time.perf_counter()
prog = torch.export.export(aot_layers._Lifted(pairs[0], names).eval(), (*(tensors[n] for n in names), *ex(4)), dynamic_shapes={"args": dyn}, strict=False)
path = f"/tmp/few-rows-probe/dyn{lo}.pt2"
aoti_compile_and_package(prog, package_path=path)
print("build", time.perf_counter() - t0, os.path.getsize(path))
run = cpu_aot.load_runner(Path(path))
ws = [[aot_layers._tensors(p)[n] for n in names] for p in pairs]
for T in (1, 2, 4, 8):
    if T < lo: continue
    e = ex(T)
    with torch.inference_mode():
        want = pairs[0](*e); got = run([*ws[0], *e])
        err = max(cpu_aot.relative_error(g, w) for g, w in zip(got, want))
        c = []
        for rep in range(30):
            t = time.perf_counter()
            for i, p in enumerate(pairs): run([*ws[i], *e])
            c.append(time.perf_counter() - t)
    print(f"T={T}: dynamic {statistics.median(c)*1e3:.2f} ms err {err:.3g}", flush=True)
