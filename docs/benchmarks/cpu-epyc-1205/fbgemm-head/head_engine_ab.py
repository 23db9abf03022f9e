# Trial of the LM head through fbgemm's dynamic int8 linear (CPU). Output: results.txt.
import sys, os, warnings, torch, statistics, json
warnings.filterwarnings("ignore")
sys.path.insert(0, "docs/benchmarks/cpu-epyc-1205")
from copy_ab import decode_ms
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.weights.loader import load_model_source
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64, enable_prefix_caching=False), load_model_source("smollm2-135m-instruct"))
head = eng.runner.model.lm_head
N = head.q.shape[0]
pk = torch.ops.quantized.linear_prepack(torch._make_per_channel_quantized_tensor(head.q, head.scale.double(), torch.zeros(N, dtype=torch.long), 0), None)
orig = head.forward
def fb(x):
    if x.shape[0] >= 3: return orig(x)
    return torch.ops.quantized.linear_dynamic(x.float(), pk, False).to(x.dtype)
decode_ms(eng, 4, 4)
res = {"int8pack": [], "fbgemm": []}
for r in range(int(sys.argv[1])):
    for name in (("int8pack", "fbgemm") if r % 2 == 0 else ("fbgemm", "int8pack")):
        head.forward = orig if name == "int8pack" else fb
        res[name].append(round(decode_ms(eng, 1, 48), 2))
print(json.dumps({k: (statistics.median(v), v) for k, v in res.items()}))
