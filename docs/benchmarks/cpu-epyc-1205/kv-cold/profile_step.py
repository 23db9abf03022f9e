"""Ad hoc: torch.profiler over 30 decode steps of the embedded SmolLM2 (CPU defaults, one
greedy request), the ops by self time; then by input shape for index_select and SDPA."""
import time, torch
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
src = load_model_source("smollm2-135m-instruct")
e = LLMEngine(EngineConfig(device="cpu"), src)
p = SamplingParams(max_tokens=400, temperature=0.0, ignore_eos=True)
e.add_request("a", list(range(100, 300)), p)
for _ in range(40):
    e.step()
ts = []
for _ in range(60):
    t = time.perf_counter(); e.step(); ts.append(time.perf_counter() - t)
ts.sort(); print("step median ms", ts[len(ts)//2] * 1e3)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
    for _ in range(30):
        e.step()
print(prof.key_averages(group_by_input_shape=True).table(sort_by="self_cpu_time_total", row_limit=12))
import collections
agg = collections.defaultdict(lambda: [0, 0.0])
for ev in prof.key_averages(group_by_input_shape=True):
    if ev.key in ("aten::index_select", "aten::_scaled_dot_product_flash_attention_for_cpu"):
        shp = str(ev.input_shapes)[:60]
        k = (ev.key, shp if ev.key == "aten::index_select" else "sdpa")
        agg[k][0] += ev.count; agg[k][1] += ev.self_cpu_time_total
for k, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1])[:8]:
    print(k, n, "%.2f ms total, %.1f us avg" % (t / 1e3, t / n))
