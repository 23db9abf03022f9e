"""A/B in one process, step by step: the CPU engine with its defaults, decode rows' attention
through the paged decode kernel that reads the cache in place ("kernel",
``backend.layers.cpu_paged_decode``) or through the torch path, gather + SDPA ("gather", the
tree before), switched before each step (``copy_ab.step_pairs``; 16-token prompts, so the
contexts grow from 17 to about STEPS + 24 tokens over a batch's run).

    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/paged-decode/ab.py [STEPS] [BATCHES]
"""
import gc
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "cpu-epyc-1205"))
from copy_ab import step_pairs_main  # noqa: E402

from backend.layers.attention import Attention  # noqa: E402

found = []


def switch(name):
    if not found:
        found.extend((a, a.cpu_decode) for a in gc.get_objects()
                     if type(a) is Attention and a.cpu_decode is not None)
        assert found, "no paged decode kernel loaded: run make model"
    for attn, kernel in found:
        attn.cpu_decode = kernel if name == "kernel" else None


step_pairs_main(("kernel", "gather"), switch, "1,4,8")
