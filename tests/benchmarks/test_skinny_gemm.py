"""benchmarks.skinny_gemm end to end on the CPU under Triton's interpreter (--smoke: tiny
shapes): every tile variant runs within tolerance of cuBLAS's path and picks come out."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from benchmarks.skinny_gemm import configs

pytest.importorskip("triton")


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_every_variant_runs_and_picks_come_out(tmp_path, weights):
    """bf16 weights, and int8 codes (each tile checked against the dequantised weight)."""
    path = tmp_path / "skinny.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "benchmarks.skinny_gemm", "--smoke",
                          "--rows", "5", "--weights", weights, "--json", str(path)], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["compile_errors"] == []
    for row in result["layers"]:
        assert row["failed"] == {}, row["failed"]  # a mismatch would be an AssertionError
        # every variant, TMA ones included (the interpreter reads descriptors too)
        assert len(row["skinny_us"]) == len(configs()) and row["best"] in [
            json.loads(k) for k in row["skinny_us"]]
        if weights == "bf16":
            assert isinstance(row["committed_us"], float)  # the default tile at 16 rows
        else:  # int8 tiles are compared with the int8 GEMM (on CUDA only)
            assert row["weights"] == "int8" and row["committed_us"] is None
    assert set(result["picks"]) == {f"16x{r['N']}x{r['K']}" for r in result["layers"]}
