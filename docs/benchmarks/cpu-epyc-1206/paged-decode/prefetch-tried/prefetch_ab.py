"""A/B in one process, step by step: the paged decode kernel as built (the K pass asks the
slot two positions ahead into the cache) against the same source built with
``-DFT_PREFETCH_AHEAD=0`` (no prefetch), switched before each step (``copy_ab.step_pairs``),
PROMPT-token prompts so the contexts run from PROMPT + 1 to about PROMPT + STEPS + 8.

    (with prefetch.patch applied to the source)
    PYTHONPATH=. python docs/benchmarks/cpu-epyc-1206/paged-decode/prefetch-tried/prefetch_ab.py \
        [STEPS] [BATCHES] [PROMPT]
"""
import gc
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                                "cpu-epyc-1205"))
import copy_ab  # noqa: E402

from backend.layers import cpu_paged_decode  # noqa: E402
from backend.layers.attention import Attention  # noqa: E402

PROMPT = int(sys.argv.pop(3)) if len(sys.argv) > 3 else 16
plain = Path(tempfile.mkdtemp()) / "no-prefetch.so"
subprocess.run(["c++", *cpu_paged_decode.FLAGS, "-DFT_PREFETCH_AHEAD=0",
                str(cpu_paged_decode.SOURCE), "-o", str(plain)], check=True)
variants = {"none": cpu_paged_decode.PagedDecode(plain)}
found = []


def switch(name):
    if not found:
        found.extend(a for a in gc.get_objects()
                     if type(a) is Attention and a.cpu_decode is not None)
        assert found, "no paged decode kernel loaded: run make model"
        variants["prefetch"] = found[0].cpu_decode
    for attn in found:
        attn.cpu_decode = variants[name]


start = copy_ab.start_decodes
copy_ab.start_decodes = lambda eng, batch, max_tokens, prompt=PROMPT, **kw: start(
    eng, batch, max_tokens, prompt, **kw)
copy_ab.step_pairs_main(("prefetch", "none"), switch, "1,8")
