"""A/B in one process: the CPU engine with its defaults (SmolLM2's Q4_1 codes as int4, the
Q8_0 head as int8, dense prefill copies kept) with the kept copies used from
cpu_dequant.COPY_MIN_ROWS rows (the head from HEAD_COPY_MIN_ROWS; "copy") or, as before,
only from DENSE_MIN_ROWS ("before"), alternating round by round. Decode step time at batch
1 / 8 / 32 / 64 (16-token prompts) and the time to the first token of a 48- and a 100-token
prompt."""
import json
import os
import statistics
import sys
import time

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import cpu_dequant
from backend.weights.loader import load_model_source


def smollm2_engine() -> tuple[LLMEngine, dict]:
    """The CPU engine on SmolLM2 with its defaults (64 sequences, no prefix cache) and the
    record a run starts from: load, weight format, kernel, LM head."""
    eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
                                 enable_prefix_caching=False),
                    load_model_source("smollm2-135m-instruct"))
    st = eng.stats()
    return eng, {"load_start": os.getloadavg(), "weights": st.weights_format,
                 "kernel": st.linear_kernel, "lm_head": st.lm_head_format}


def start_decodes(eng, batch, max_tokens, prompt=16, **params):
    """``batch`` requests with ``prompt``-token prompts (``params`` go to their
    SamplingParams), stepped until each has its first token: every later step is a pure
    decode."""
    for i in range(batch):
        eng.add_request(f"b{batch}-{i}-{time.time()}", list(range(200 + i, 200 + i + prompt)),
                        SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params))
    while any(s.num_generated == 0 for s in eng.seqs.values()):
        eng.step()


def step_pairs(eng, batch: int, steps: int, names: tuple[str, str], switch) -> dict:
    """Decodes of ``batch`` sequences where ``switch(name)`` turns one of the two variants
    ``names`` on before each step, alternately (the order inside a pair swaps every
    pair), each step timed alone: a VM's drifts fall on both sides. Medians of each side's
    step times and of the ratio within each pair of steps."""
    start_decodes(eng, batch, steps + 8)
    a, b = names
    times = {a: [], b: []}
    for n in range(steps):
        name = names[(n + n // 2) % 2]
        switch(name)
        t = time.perf_counter()
        eng.step()
        times[name].append((time.perf_counter() - t) * 1e3)
    while eng.has_unfinished():
        eng.step()
    ratios = [x / y for x, y in zip(times[a], times[b])]
    return {"steps_each": len(times[a]),
            f"{a}_ms_median": round(statistics.median(times[a]), 3),
            f"{b}_ms_median": round(statistics.median(times[b]), 3),
            f"{a}_over_{b}_median_of_pairs": round(statistics.median(ratios), 4),
            f"pairs_{a}_faster": sum(r < 1 for r in ratios)}


def model_attribute_switch(attr: str, on: str):
    """A ``switch`` for ``step_pairs_main``: the engine's model keeps what it loaded into
    ``attr`` (compiled pieces; found once, and required) under the variant ``on``, and runs
    with ``attr`` None under the other."""
    import gc
    found = []

    def switch(name):
        if not found:
            found.extend((o, getattr(o, attr)) for o in gc.get_objects()
                         if type(o).__name__ == "LlamaModel" and getattr(o, attr) is not None)
            assert found, f"no {attr} loaded: run make model"
        for model, value in found:
            setattr(model, attr, value if name == on else None)
    return switch


def step_pairs_main(names: tuple[str, str], switch, batches: str) -> None:
    """The command line of a step-by-step A/B: ``[STEPS] [BATCHES]`` (default 400 and
    ``batches``), a warm-up, ``step_pairs`` per batch, the JSON on stdout; the first
    variant is left on."""
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    sizes = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else batches).split(",")]
    eng, out = smollm2_engine()
    step_pairs(eng, 4, 16, names, switch)  # warm-up
    out["batches"] = {}
    for b in sizes:
        out["batches"][b] = step_pairs(eng, b, steps, names, switch)
        print(b, out["batches"][b], file=sys.stderr, flush=True)
    switch(names[0])
    out["load_end"] = os.getloadavg()
    print(json.dumps(out))


def decode_ms(eng, batch, steps=24, prompt=16, **params):
    """ms per decode step of ``batch`` requests with ``prompt``-token prompts (``params`` go
    to their SamplingParams), after their prefills."""
    start_decodes(eng, batch, steps + 4, prompt, **params)
    eng.step()
    t = time.perf_counter()
    for _ in range(steps):
        eng.step()
    ms = (time.perf_counter() - t) * 1e3 / steps
    while eng.has_unfinished():
        eng.step()
    return ms


def first_token_ms(eng, n):
    t = time.perf_counter()
    eng.generate([list(range(300, 300 + n))], SamplingParams(max_tokens=1))
    return (time.perf_counter() - t) * 1e3


def sample(eng, s, batches, prompts, first_token=None):
    """One round of one variant into ``s``: step ms per batch, first-token ms per prompt."""
    first_token = first_token or first_token_ms
    for b in batches:
        s.setdefault(f"step_ms_batch{b}", []).append(round(decode_ms(eng, b), 2))
    for n in prompts:
        s.setdefault(f"first_token_ms_{n}", []).append(round(first_token(eng, n), 1))


def alternate(eng, out, names, switch, rounds, batches=(1, 8, 32), prompts=(100, 512),
              first_token=None):
    """``rounds`` rounds of the two variants ``names``, their order swapped every round:
    ``switch(name)`` turns one on, then ``sample`` records it into ``out["samples"]``."""
    a, b = names
    for r in range(rounds):
        for name in (a, b) if r % 2 == 0 else (b, a):
            switch(name)
            s = out["samples"].setdefault(name, {})
            sample(eng, s, batches, prompts, first_token)
            print(name, {k: v[-1] for k, v in s.items()}, file=sys.stderr, flush=True)


def finish(out):
    """Medians per variant and the closing load; printed as JSON."""
    out["medians"] = {name: {k: statistics.median(v) for k, v in s.items()}
                      for name, s in out["samples"].items()}
    out["load_end"] = os.getloadavg()
    print(json.dumps(out))


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    copy = dict(cpu_dequant.COPY_MIN_ROWS)
    head = dict(cpu_dequant.HEAD_COPY_MIN_ROWS)
    before = {k: cpu_dequant.DENSE_MIN_ROWS[k] for k in copy}
    eng = LLMEngine(EngineConfig(kv_cache_memory_gib=0.5, max_model_len=1024, max_num_seqs=64,
                                 enable_prefix_caching=False),
                    load_model_source("smollm2-135m-instruct"))
    st = eng.stats()
    out = {"load_start": os.getloadavg(), "weights": st.weights_format,
           "kernel": st.linear_kernel, "copy_min_rows": copy, "head_copy_min_rows": head,
           "dense_min_rows": before, "samples": {}}
    decode_ms(eng, 8, 4)  # warm-up
    for r in range(rounds):
        for name, rows in (("before", before), ("copy", copy)) if r % 2 == 0 else \
                (("copy", copy), ("before", before)):
            cpu_dequant.COPY_MIN_ROWS.update(rows)
            cpu_dequant.HEAD_COPY_MIN_ROWS.update(head if name == "copy" else
                                                  {k: before[k] for k in head})
            sample(eng, out["samples"].setdefault(name, {}), (1, 8, 32, 64), (48, 100))
    finish(out)


if __name__ == "__main__":
    main()
