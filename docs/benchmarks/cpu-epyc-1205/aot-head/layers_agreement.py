"""Ad hoc: greedy decodes of the embedded SmolLM2 (CPU defaults) with the compiled one-token
layer pieces against the eager layers, same engine, six chat prompts, 64 tokens: tokens
equal, the first position where they part, and over the steps before it (same history on
both sides) the largest logit difference relative to the eager logits' spread (max - min);
then both against a float32 engine on the same codes (greedy tokens equal to its).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1205/aot-head/layers_agreement.py
"""
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source

src = load_model_source("smollm2-135m-instruct")
eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.25, max_model_len=1024), src)
model = eng.runner.model
layers = model.one_token_layers
assert layers is not None, eng.stats().cpu_aot_kernels
QUESTIONS = ["What is the capital of Germany?", "Write a haiku about the sea.",
             "Explain what a GPU does in two sentences.", "List three prime numbers.",
             "Why is the sky blue?", "Translate 'good morning' into French."]
params = SamplingParams(max_tokens=64, temperature=0, ignore_eos=True)
orig = model.head_fn
f32 = LLMEngine(EngineConfig(kv_cache_memory_gib=0.25, max_model_len=1024, dtype="float32",
                             cpu_aot_kernels="off"), src)
same = total = 0
agree = {"eager": 0, "compiled": 0}
for question in QUESTIONS:
    prompt = src.tokenizer.encode(f"<|im_start|>user\n{question}<|im_end|>\n"
                                  "<|im_start|>assistant\n")
    out, logits = {}, {}
    for name, fn in (("eager", None), ("compiled", layers)):
        model.one_token_layers = fn
        rows = logits[name] = []
        model.head_fn = lambda *a, rows=rows, **k: rows.append(orig(*a, **k)) or rows[-1]
        out[name] = eng.generate([prompt], params)[0]
        model.head_fn = orig
    eager, compiled = out["eager"], out["compiled"]
    parted = next((i for i, (a, b) in enumerate(zip(eager, compiled)) if a != b), None)
    shared = len(eager) if parted is None else parted + 1  # steps with the same history
    worst = max(((c - e).abs().max() / (e.max() - e.min())).item()
                for e, c in zip(logits["eager"][:shared], logits["compiled"][:shared]))
    same += sum(a == b for a, b in zip(eager, compiled))
    total += len(eager)
    print(f"{question!r}: tokens equal {sum(a == b for a, b in zip(eager, compiled))}/"
          f"{len(eager)}, first difference at {parted}, largest logit difference over the "
          f"{shared} shared steps {worst:.4f} of the spread", flush=True)
    ref = f32.generate([prompt], params)[0]
    for name in ("eager", "compiled"):
        agree[name] += sum(a == b for a, b in zip(ref, out[name]))
print(f"all: {same}/{total} tokens equal")
print(f"against float32 activations: eager {agree['eager']}/{total}, "
      f"compiled {agree['compiled']}/{total} tokens equal")
