"""A/B step by step in one process: decodes of B sequences (16-token prompts) where the
eager blocks run as one flat loop ("flat") or through each block's own forward
("layers") on alternate steps, each step timed alone; a VM's drifts fall on both sides.
Medians of each side's step times and of the ratio within each pair of steps.

    python docs/benchmarks/cpu-epyc-1205/flat_loop_steps.py [STEPS] [BATCHES] > OUT.json
"""
import os
import sys

from backend.model import LlamaModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from copy_ab import step_pairs_main  # noqa: E402


def switch(name: str) -> None:
    LlamaModel.flat_eager = name == "flat"


if __name__ == "__main__":
    step_pairs_main(("flat", "layers"), switch, "1,8,32")
