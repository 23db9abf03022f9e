"""Ad hoc: greedy ids of two chat prompts on the CPU (SmolLM2, the defaults), run in each tree."""
import torch
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.weights.loader import load_model_source
src = load_model_source("smollm2-135m-instruct")
eng = LLMEngine(EngineConfig(device="cpu", max_model_len=1024), src)
tok = src.tokenizer
ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}])) for p in ("Tell me about the sea.", "What is 17 times 23?")]
out = eng.generate(ids, SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True))
print(out)
