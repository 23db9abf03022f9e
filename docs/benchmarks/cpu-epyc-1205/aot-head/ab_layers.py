"""A/B in one process, step by step: the CPU engine with its defaults (SmolLM2's Q4_1 codes as
int4, the Q8_0 head as int8 through its compiled GEMV) with the work between attention calls
of one-token steps compiled ahead of time ("layers", ``backend.engine.aot_layers``, the
package ``make model`` builds) or eager ("eager": the tree before), switched before each
step (``copy_ab.step_pairs``). Decode steps at batch 1 (and 2, the control: two rows take
the eager layers either way).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1205/aot-head/ab_layers.py [STEPS] [BATCHES]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from copy_ab import model_attribute_switch, step_pairs_main  # noqa: E402

step_pairs_main(("layers", "eager"), model_attribute_switch("one_token_layers", "layers"), "1,2")
