"""A/B step by step in one process: the flat loop's matmuls through the quantised layers'
bound kernels ("bound", ``Linear.few_rows_fn``, the default for steps of few rows) or
through each layer's ``forward`` ("forward", as before), on alternate decode steps of B
sequences (16-token prompts), each step timed alone. Medians of each side's step times
and of the ratio within each pair of steps.

    python docs/benchmarks/cpu-epyc-1205/few_rows_steps.py [STEPS] [BATCHES] > OUT.json
"""
import os
import sys

from backend.model import LlamaModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from copy_ab import step_pairs_main  # noqa: E402

MATMULS = LlamaModel._matmuls


def forwards(self, rows):
    MATMULS(self, rows)  # builds the lists where needed
    return self._forwards


def switch(name: str) -> None:
    LlamaModel._matmuls = MATMULS if name == "bound" else forwards


if __name__ == "__main__":
    step_pairs_main(("bound", "forward"), switch, "1,8")
