"""bench_gateway end to end on a tiny setting: real fake upstream, gateway and client processes."""
import json
import subprocess
import sys

from tests.loadtests.conftest import ROOT


def test_latency_phase_with_stamps_and_samples(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.gateway", "run", "--phases", "latency",
         "--concurrency", "1,3", "--requests-1", "3", "--rounds", "1", "--min-requests", "6",
         "--ttft-ms", "20", "--itl-ms", "1", "--stamp", "--tag=-t",
         "--samples-dir", str(tmp_path / "s"), "--out", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    (line,) = (tmp_path / "gateway-latency-repeats.jsonl").read_text().splitlines()
    doc = json.loads(line)  # a tagged run is a repeat: one line of the phase's JSONL
    assert doc["run"] == "t"
    assert doc["meta"]["fake_upstream"]["timers"] == "precise"
    runs = {(r["concurrency"], r["target"]): r for r in doc["runs"]}
    assert set(runs) == {(1, "direct"), (1, "gateway"), (3, "direct"), (3, "gateway")}
    for (c, target), r in runs.items():
        n = 3 if c == 1 else 6
        assert r["errors"] == {} and r["ttft"]["n"] == n and r["request_path"]["n"] == n
        # the fake's own wait is the injected TTFT; the client's TTFT can only be longer
        assert 20 <= r["fake_wait"]["p50_ms"] < 25
        assert r["ttft"]["p50_ms"] > r["fake_wait"]["p50_ms"]
        rows = (tmp_path / "s" / f"samples-t-c{c}-{target}.jsonl").read_text().splitlines()
        stamps = [json.loads(x) for x in rows]
        assert len(stamps) == n
        assert all(s["t0"] < s["fake_recv"] < s["fake_sent"] < s["t_first"] <= s["t_end"]
                   for s in stamps)
    assert runs[(3, "gateway")]["gateway_log"]["rows"] == 6
    added = {a["concurrency"]: a for a in doc["added"]}
    assert set(added) == {1, 3} and "added_request_path_p50_ms" in added[3]
