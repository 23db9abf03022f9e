# Tried and dropped: a whole batch-1 SmolLM2 decode step (flat-loop/bare_function.py's
# step: the blocks, attention and the head as one bare function over the engine's weights)
# under torch.compile against the same function eager (330-token context).
# Output: whole-step.txt.
import os, sys, time, torch
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "flat-loop"))
from bare_function import cos, sin, step, x  # the set-up and the step
def lean(fn, n=60):
    t = time.perf_counter()
    for _ in range(n): fn(x, cos, sin)
    return (time.perf_counter() - t) / n * 1e3
t = time.perf_counter()
cstep = torch.compile(step, dynamic=False)
cstep(x, cos, sin)
print("compile s", time.perf_counter() - t, flush=True)
for r in range(3):
    print("eager", round(lean(step), 2), "compiled", round(lean(cstep), 2), flush=True)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CPU]) as p:
    for _ in range(10): cstep(x, cos, sin)
print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
