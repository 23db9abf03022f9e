"""bench_ttft appends one labelled row per run and charts the history."""
import csv
import os
import subprocess
import sys

from .conftest import ROOT


def test_two_runs_two_rows_and_a_compare_chart(lt_fake, tmp_path):
    url, _ = lt_fake(ttft_ms=50, itl_ms=5, tokens=64)
    hist = tmp_path / "hist.csv"
    for label in ("baseline", "flash"):
        res = subprocess.run([sys.executable, "-m", "loadtests.bench_ttft", "--host", url,
                              "--model", "fake", "--label", label, "--warmup-runs", "2",
                              "--measure-runs", "6", "--prompt-tokens", "12",
                              "--output-tokens", "6", "--csv", str(hist)],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, res.stderr[-2000:]
        assert "p99 from <100 samples" in res.stdout and "n=6" in res.stdout
    rows = list(csv.DictReader(open(hist)))
    assert [r["label"] for r in rows] == ["baseline", "flash"]
    for r in rows:
        assert int(r["measured"]) == 6 and r["tokens_source"] == "usage"
        assert 50 <= float(r["ttft_p50_ms"]) < 150
        assert abs(float(r["tpot_p50_ms"]) - 5) < 5 and r["p99_reliable"] == "False"
        assert float(r["prompt_tokens_seen"]) == 12
    res = subprocess.run([sys.executable, "-m", "loadtests.bench_ttft", "--compare", "--csv",
                          str(hist), "--png", str(tmp_path / "h.png")],
                         cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert os.path.getsize(tmp_path / "h.png") > 5000
