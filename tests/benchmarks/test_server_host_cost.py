"""benchmarks.server_host_cost end to end on a tiny setting: the real app, engine and a client
process; the figures are there and count what was streamed (no timing is asserted)."""
import json
import subprocess
import sys

from tests.loadtests.conftest import ROOT


def test_small_run_writes_every_figure(tmp_path):
    out = tmp_path / "host.json"
    res = subprocess.run(
        [sys.executable, "-m", "benchmarks.server_host_cost", "--model", "synthetic:tiny",
         "--concurrency", "4", "--max-tokens", "8", "--requests-per-worker", "2",
         "--repeats", "1", "--profile", "--profile-top", "5", "--components",
         "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    doc = json.loads(out.read_text())
    (run,) = doc["runs"]
    client = run["client"]
    assert client["errors"] == 0 and client["done"] == 8
    assert client["completion_tokens"] == 4 * 2 * 8  # ignore_eos: every request runs to max
    assert run["loop_cpu_s"] > 0 and run["loop_cpu_us_per_token"] > 0
    (floor,) = doc["floor_runs"]  # the bare aiohttp streams took the same client load
    assert floor["client"]["completion_tokens"] == client["completion_tokens"]
    assert floor["client"]["content_chunks"] == 4 * 2 * 8 and floor["loop_cpu_s"] > 0
    engine = run["engine"]
    assert engine["steady_steps"] > 0 and engine["steady"]["forward_wall_ms_median"] > 0
    assert engine["all"]["tokens"] == client["completion_tokens"]
    assert set(doc["headline"]) >= {"loop_cpu_us_per_token", "engine_host_cpu_us_per_step"}
    assert set(doc["components_us_per_token"]) == {"detokenize", "chunk_bytes", "handoff"}
    profile = doc["profile"]
    assert len(profile["loop_top"]) == 5 and len(profile["engine_step_top"]) == 5
    # the forward and the sampler are left out of the engine's host profile
    assert not any("model.py" in r["function"] for r in profile["engine_step_top_cumulative"])
    assert "loop_cpu_us_per_token" in res.stdout
