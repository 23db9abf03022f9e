"""The tree's own rules, checked on every run: ruff's lint and the import contracts in
pyproject.toml (no cycles inside a package, the stream grammar a leaf, the products
independent of each other and of the benchmarks)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_finds_nothing():
    proc = _run([str(BIN / "ruff"), "check", "--no-cache", "."])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_import_contracts_are_kept():
    proc = _run([str(BIN / "lint-imports"), "--no-cache"])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " 0 broken" in proc.stdout.split("Contracts:")[-1], proc.stdout[-2000:]
