"""The int4 one-token GEMV compiled for sm_90 on this host (no GPU needed: Triton's bundled
ptxas): with ``EARLY`` its first two steps' code and record loads come before the wait for
the previous kernel and nothing spills; without it no load comes before the wait. Compiled
in a child process: this one runs Triton's interpreter, which compiles nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

_COMPILE = textwrap.dedent("""
    import json
    from backend.layers import quant_kernels as qk
    from benchmarks.sass import compile_sm90

    TYPES = dict(x_ptr="*bf16", p_ptr="*i32", sm_ptr="*bf16", y_ptr="*bf16",
                 part_ptr="*fp32", cnt_ptr="*i32", nw_ptr="*bf16", ss_ptr="*fp32",
                 res_ptr="*bf16", eps="fp32")
    CONSTS = dict(G=128, BLOCK_N=64, GROUPS=1, STAGES=3, BF16=True, PDL=True, SS_N=1,
                  EVEN=True, PARTIAL=True)
    out = {}
    for name, early, epi in (("early", True, qk.PLAIN), ("early_added", True, qk.ADDED),
                             ("default", False, qk.PLAIN)):
        k = compile_sm90(qk._int4_gemv_words, TYPES, dict(CONSTS, EPI=epi, EARLY=early),
                         list(TYPES)[:-1] + ["K", "hw"], num_warps=2, num_stages=3)
        lines = k.sass.splitlines()
        wait = next(i for i, s in enumerate(lines) if "ACQBULK" in s)  # griddepcontrol.wait
        out[name] = dict(before=k.count(r"\\bLDG\\.", 0, wait),
                         after=k.count(r"\\bLDG(STS)?\\.", wait),
                         spills=k.count(r"\\b(STL|LDL)\\b"), registers=k.registers)
    print(json.dumps(out))
""")


@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["early", "early_added"])
def test_early_weights_are_requested_before_the_wait(compiled, name):
    k = compiled[name]
    assert k["before"] == 2 * (8 + 1)  # two steps: eight 16-byte code loads, one record load
    assert k["after"] > 0 and k["spills"] == 0 and k["registers"] <= 255


def test_the_default_gemv_loads_nothing_before_the_wait(compiled):
    k = compiled["default"]
    assert k["before"] == 0 and k["after"] > 0 and k["spills"] == 0
