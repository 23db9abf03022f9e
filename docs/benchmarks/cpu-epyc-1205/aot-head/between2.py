"""Ad hoc probe (PYTHONPATH=.; run while other jobs ran): the work between two attention calls (SmolLM2, one token) compiled ahead of time once,
the two layers' weights passed as inputs (one package for every pair), run over all 29 pairs
in turn against the same calls eager."""
import statistics, tempfile, time, torch
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.weights.loader import load_model_source
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.1, max_model_len=256, max_num_seqs=4,
                             prefill_dense_weights="off"), load_model_source("smollm2-135m-instruct"))
m = eng.runner.model
class Between(torch.nn.Module):
    def __init__(self, a, b):
        super().__init__(); self.a, self.b = a, b
    def forward(self, out, residual, cos, sin):
        y, residual = self.a.post_attention(out, residual)
        q, k, v, residual = self.b.pre_attention(y, residual, cos, sin)
        return q, k, v, residual
pairs = [Between(m.layers[i], m.layers[i + 1]).eval() for i in range(len(m.layers) - 1)]
names = [n for n, _ in pairs[0].named_parameters()] + [n for n, _ in pairs[0].named_buffers()]
def state(p):
    d = dict(p.named_parameters()); d.update(p.named_buffers()); return [d[n] for n in names]
class Lifted(torch.nn.Module):
    def __init__(self, inner):
        super().__init__(); self.inner = inner
    def forward(self, *args):
        n = len(names)
        return torch.func.functional_call(self.inner, dict(zip(names, args[:n])), args[n:])
dt = m.dtype
out = torch.randn(1, 576).to(dt); res = torch.randn(1, 576).to(dt)
cos, sin = m.cos_table[[20]], m.sin_table[[20]]
t = time.perf_counter()
ep = torch.export.export(Lifted(pairs[0]), (*state(pairs[0]), out, res, cos, sin), strict=False)
p = torch._inductor.aoti_compile_and_package(ep, package_path=tempfile.mkdtemp() + "/between.pt2")
print("inputs", len(names) + 4, "compile s", round(time.perf_counter() - t, 1), flush=True)
run = torch._C._aoti.AOTIModelPackageLoader(p, "model", False, 1, -1).run
states = [state(pp) for pp in pairs]
with torch.inference_mode():
    errs = []
    for pp, st in zip(pairs, states):
        ref = pp(out, res.clone(), cos, sin); got = run([*st, out, res, cos, sin])
        errs.append(max(((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in zip(got, ref)))
    print("max rel err over pairs", max(errs), flush=True)
    def eager_chain():
        for pp in pairs: pp(out, res, cos, sin)
    def aot_chain():
        for st in states: run([*st, out, res, cos, sin])
    for _ in range(3):
        te = []; ta = []
        for _ in range(30):
            t = time.perf_counter(); eager_chain(); te.append(time.perf_counter() - t)
            t = time.perf_counter(); aot_chain(); ta.append(time.perf_counter() - t)
        print(f"29 pairs: eager {statistics.median(te)*1e3:.2f} ms, aot {statistics.median(ta)*1e3:.2f} ms", flush=True)
