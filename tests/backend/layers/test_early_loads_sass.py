"""Kernels compiled for sm_90 on this host (no GPU needed: Triton's bundled ptxas), for the
loads they issue before the wait for the previous kernel (``griddepcontrol.wait``, ACQBULK in
SASS): the int4 one-token GEMV with ``EARLY`` requests its first two steps' codes and records
there, the decode kernel with ``EARLY`` its first K/V tile; neither spills; without EARLY
neither loads anything before the wait. Compiled in a child process: this one runs
Triton's interpreter, which compiles nothing."""
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
    from benchmarks.early_loads import GEMV_CASES, decode, gemv

    builds = {"gemv_early": (GEMV_CASES["plain_split"], True),
              "gemv_early_added": (GEMV_CASES["added"], True),
              "gemv_early_normed": (GEMV_CASES["normed"], True),
              "gemv_default": (GEMV_CASES["plain_split"], False)}
    out = {name: gemv(*args).around_the_wait() for name, args in builds.items()}
    for name, early in (("decode_early", True), ("decode_default", False)):
        out[name] = decode("auto", 16, 0, early).around_the_wait()
    print(json.dumps(out))
""")



@pytest.fixture(scope="module")
def compiled() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ["gemv_early", "gemv_early_added", "gemv_early_normed"])
def test_early_weights_are_requested_before_the_wait(compiled, name):
    k = compiled[name]
    # two steps: eight 16-byte code loads and one record load each
    assert k["ldg_before_wait"] == 2 * (8 + 1)
    assert k["ldg_after_wait"] > 0 and k["spills"] == 0 and k["registers"] <= 255


def test_the_early_decode_requests_its_first_tile_before_the_wait(compiled):
    k = compiled["decode_early"]
    # K and V rows of 64 tokens x 128 bf16, 16 bytes a load: 16 loads each
    assert k["ldg_before_wait"] >= 2 * 16
    assert k["ldg_after_wait"] + k["ldgsts"] > 0 and k["spills"] == 0


@pytest.mark.parametrize("name", ["gemv_default", "decode_default"])
def test_without_early_nothing_is_loaded_before_the_wait(compiled, name):
    k = compiled[name]
    assert k["ldg_before_wait"] == 0 and k["ldg_after_wait"] + k["ldgsts"] > 0
    assert k["spills"] == 0
