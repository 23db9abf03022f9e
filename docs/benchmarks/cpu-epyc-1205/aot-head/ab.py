"""A/B in one process, step by step: the CPU engine with its defaults (SmolLM2's Q4_1 codes as
int4, the Q8_0 head as int8) with the LM head's one-row GEMV compiled ahead of time ("aot",
the package ``make model`` builds, loaded as ``--cpu-aot-kernels auto`` loads it) or torch's
``_weight_int8pack_mm`` ("torch": the tree before), switched before each step
(``copy_ab.step_pairs``). Decode steps at batch 1 and 2 (one-row calls: at 2+ the head takes
torch's kernel or its copy either way).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1205/aot-head/ab.py [STEPS] [BATCHES] > OUT.json
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from copy_ab import smollm2_engine, step_pairs_main  # noqa: E402

_probe, _ = smollm2_engine()
KERNEL = _probe.runner.model.lm_head.one_row
assert KERNEL is not None, _probe.stats().cpu_aot_kernels
del _probe


HEADS = []


def switch(name):
    if not HEADS:  # the head of the engine step_pairs_main builds, found once
        import gc
        HEADS.extend(o for o in gc.get_objects() if type(o).__name__ == "Int8Linear"
                     and o.out_features == 49152 and o.one_row is not None)
    for head in HEADS:
        head.one_row = KERNEL if name == "aot" else None


step_pairs_main(("aot", "torch"), switch, "1,2")
