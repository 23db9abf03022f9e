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


def test_install_of_a_partial_sweep_keeps_what_it_did_not_sweep(monkeypatch):
    """A sweep of one format at one token count (``--formats int4-g128 --tokens 1``) replaces
    that table's one-token entry only: its GEMM buckets and the other tables stay as
    committed."""
    import copy

    from backend.layers import quant_kernels as qk
    from benchmarks import quant_sweep

    monkeypatch.setattr(qk, "CONFIGS", copy.deepcopy(qk.CONFIGS))
    before = copy.deepcopy(qk.CONFIGS)
    cfg = {"kind": "triton", "BLOCK_N": 32, "BYTES": 128, "MAGIC": 1, "WORDS": 1}
    picks = {"int4-g128@1": {"best_config": cfg}, "int4@1": {"best_config": None},
             "int8@1": {"best_config": None}}
    done = quant_sweep.install(picks, ("int4-g128",))
    assert done == {"int4-g128@1": {k: v for k, v in cfg.items() if k != "kind"}}
    assert qk.CONFIGS["int4-g128"][1] == done["int4-g128@1"]
    assert {b: qk.CONFIGS["int4-g128"][b] for b in (16, 32, 64, 128)} == {
        b: before["int4-g128"][b] for b in (16, 32, 64, 128)}
    assert qk.CONFIGS["int4-g32"] == before["int4-g32"] and qk.CONFIGS["int8"] == before["int8"]


def test_unknown_format_is_refused(tmp_path):
    from benchmarks import quant_sweep

    with pytest.raises(SystemExit):
        quant_sweep.main(["--json-dir", str(tmp_path / "out"), "--formats", "int3"])
    assert not (tmp_path / "out").exists()
