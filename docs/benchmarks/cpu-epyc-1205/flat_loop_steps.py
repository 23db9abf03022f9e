"""A/B step by step in one process: decodes of B sequences (16-token prompts) where the
eager blocks run as one flat loop ("flat") or through each block's own forward
("layers") on alternate steps, each step timed alone; a VM's drifts fall on both sides.
Medians of each side's step times and of the ratio within each pair of steps.

    python docs/benchmarks/cpu-epyc-1205/flat_loop_steps.py [STEPS] [BATCHES] > OUT.json
"""
import json
import os
import sys

from backend.model import LlamaModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from copy_ab import smollm2_engine, step_pairs  # noqa: E402


def pairs(eng, batch: int, steps: int) -> dict:
    def switch(name):
        LlamaModel.flat_eager = name == "flat"
    return step_pairs(eng, batch, steps, ("flat", "layers"), switch)


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "1,8,32").split(",")]
    eng, out = smollm2_engine()
    out["batches"] = {}
    pairs(eng, 4, 16)  # warm-up
    for b in batches:
        out["batches"][b] = pairs(eng, b, steps)
        print(b, out["batches"][b], file=sys.stderr, flush=True)
    out["load_end"] = os.getloadavg()
    LlamaModel.flat_eager = True
    print(json.dumps(out))


if __name__ == "__main__":
    main()
