"""benchmarks.one_token_gemv end to end on the CPU under Triton's interpreter (--smoke: tiny
shapes): every fused variant runs within tolerance of the unfused steps and picks come out."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def test_every_variant_runs_and_picks_come_out(tmp_path):
    path = tmp_path / "gemv.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "benchmarks.one_token_gemv", "--smoke",
                          "--json", str(path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(path.read_text())
    assert result["compile_errors"] == []
    for row in result["layers"]:
        # a variant's entry is its time, or the error (a mismatch is an AssertionError)
        assert all(isinstance(t, float) for t in row["fused_us"].values()), row["fused_us"]
        for way in ("unfused", "fused"):  # every variant of each way ran and matched
            assert all(isinstance(t, float) for t in row["int8_variant_us"][way].values()), row
        assert len(row["int8_variant_us"]["unfused"]) == len(row["int8_variants"])
        assert row["best"] in row["fused_us"]
    assert set(result["picks"]["bf16"]) == {f"{r['N']}x{r['K']}" for r in result["layers"]}
