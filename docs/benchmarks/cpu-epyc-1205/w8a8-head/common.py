"""Shared by the two ad hoc scripts: the embedded SmolLM2 on the CPU defaults, the inputs its
int8 LM head sees at every position of some texts (1,024 tokens each, through
``LLMEngine.score``), and a median timer (``benchmarks.quant``'s, after 10 warm-up calls)."""
from pathlib import Path

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.weights.loader import load_model_source
from benchmarks.quant import _cpu_time_us


def head_inputs(paths):
    """(the head layer, [the head's inputs per text], [the token ids per text])."""
    src = load_model_source("smollm2-135m-instruct")
    engine = LLMEngine(EngineConfig(device="cpu"), src)
    head = engine.runner.model.lm_head
    captured, toks = [], []
    orig = type(head).forward

    def grab(self, x):
        if self is head:
            captured.append(x.detach().clone())
        return orig(self, x)
    type(head).forward = grab
    try:
        for p in paths:
            ids = src.tokenizer.encode(Path(p).read_text())[:1024]
            engine.score(ids)
            toks.append(ids)
    finally:
        type(head).forward = orig
    return head, [h[: len(ids)] for h, ids in zip(captured, toks)], toks


def median_ms(fn, n=200):
    for _ in range(9):  # _cpu_time_us makes the tenth
        fn()
    return _cpu_time_us(fn, n) / 1e3
