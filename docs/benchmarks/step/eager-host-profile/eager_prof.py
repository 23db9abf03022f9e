"""Ad hoc: where an eager (no CUDA graph) decode step's host time goes: ablation rows 2-4."""
import cProfile, io, pstats, random, sys, time
import torch
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
from benchmarks import ablation

a = ablation.parse_args(["--model", "synthetic:llama-2-7b", "--device", "cuda", "--no-compile"])
base = dict(device="cuda", dtype="auto", weights_dtype="auto", max_model_len=768,
            kv_cache_memory_gib=None, enable_prefix_caching=False)
cfgs = ablation.row_configs(a, base, 64)
src = load_model_source("synthetic:llama-2-7b")
model = None
for row in [int(r) for r in sys.argv[1].split(",")]:
    f, conc = cfgs[row]["fields"], cfgs[row]["concurrency"]
    eng = LLMEngine(EngineConfig(**f), src, model=model)
    model = eng.runner.model
    rng = random.Random(0)
    for i in range(conc):
        eng.add_request(f"r{row}-{i}", [rng.randrange(3, 30000) for _ in range(512)],
                        SamplingParams(max_tokens=200, ignore_eos=True, temperature=0.0))
    for _ in range(conc + 15):
        eng.step()
    torch.cuda.synchronize()
    t = time.perf_counter(); n = 20
    for _ in range(n): eng.step()
    torch.cuda.synchronize()
    print(f"== row {row} batch {conc}: step {(time.perf_counter() - t) / n * 1e3:.2f} ms", flush=True)
    pr = cProfile.Profile(); pr.enable()
    for _ in range(n): eng.step()
    torch.cuda.synchronize()
    pr.disable()
    s = io.StringIO(); st = pstats.Stats(pr, stream=s)
    st.sort_stats("tottime").print_stats(30); st.sort_stats("cumtime").print_stats(40)
    print(s.getvalue(), flush=True)
    for i in range(conc): eng.abort_request(f"r{row}-{i}")
    del eng
