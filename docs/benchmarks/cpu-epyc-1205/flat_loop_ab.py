"""A/B in one process: the CPU engine with its defaults, the eager step ops running the
blocks as one flat loop ("flat", ``LlamaModel.flat_eager``) or through each block's own
forward ("layers", as before), alternating round by round. Decode step time at batch 1 / 8
/ 32 (16-token prompts) and the time to the first token of 100- and 512-token prompts.

    python docs/benchmarks/cpu-epyc-1205/flat_loop_ab.py [ROUNDS] > OUT.json
"""
import os
import sys

from backend.model import LlamaModel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from copy_ab import alternate, decode_ms, finish, smollm2_engine  # noqa: E402
from onednn_ab import first_token_ms  # noqa: E402


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    eng, out = smollm2_engine()
    out["samples"] = {}
    decode_ms(eng, 8, 4)  # warm-up
    alternate(eng, out, ("layers", "flat"),
              lambda name: setattr(LlamaModel, "flat_eager", name == "flat"), rounds,
              first_token=first_token_ms)
    finish(out)


if __name__ == "__main__":
    main()
