"""benchmarks.quant_sweep end to end on the CPU under Triton's interpreter (--smoke: tiny
shapes): every variant runs and matches the dequantised reference, picks and JSON come out."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")


def test_sweep_runs_every_variant_and_picks(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-m", "benchmarks.quant_sweep", "--smoke",
                          "--json-dir", str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    triton_rows = [r for r in rows if r["variant"].startswith("triton")]
    assert triton_rows and all("us" in r and r["rel_err"] < 1e-3 for r in triton_rows), [
        (r["variant"], r.get("error")) for r in triton_rows if "us" not in r]
    picks = json.loads((tmp_path / "picks.json").read_text())
    tables = ("int8", "int4", "int4-g32", "int4-g128")
    assert set(picks["installed"]) == {f"{t}@{m}" for t in tables for m in (1, 20)}
    assert all(p["best_triton"] for k, p in picks["picks"].items() if k.split("@")[0] != "bf16")
