"""A/B in one process, step by step: the CPU engine with its defaults (SmolLM2's Q4_1 codes
as int4, the Q8_0 head as int8) with the work between attention calls of steps of 2-8 rows
compiled ahead of time ("pieces", the package ``make model`` builds beside the one-token
one) or eager ("eager": the tree before), switched before each step
(``copy_ab.step_pairs``). Decode steps at batch 2, 4 and 8 (and 1, the control: one-row
steps take the one-token package either way).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/few-rows/ab.py [STEPS] [BATCHES]
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "cpu-epyc-1205"))
from copy_ab import model_attribute_switch, step_pairs_main  # noqa: E402

step_pairs_main(("pieces", "eager"), model_attribute_switch("few_rows_layers", "pieces"),
                "1,2,4,8")
