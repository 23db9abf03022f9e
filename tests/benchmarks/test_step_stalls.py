"""benchmarks.step_stalls on the CPU engine (synthetic tiny model, tiny counts)."""
import json

from benchmarks.step_stalls import main


def test_step_stalls_reports_every_run(tmp_path):
    out = main(["--concurrency", "2,8", "--prompts", "distinct,shared", "--requests", "10",
                "--prompt-tokens", "40", "--output-tokens", "4", "--json",
                str(tmp_path / "s.json")])
    assert json.loads((tmp_path / "s.json").read_text()) == json.loads(json.dumps(out))
    runs = {(r["prompts"], r["concurrency"]): r for r in out["runs"]}
    assert set(runs) == {(k, c) for k in ("distinct", "shared") for c in (2, 8)}
    for r in runs.values():
        assert r["requests"] == 10 and r["steps"] > 0 and r["eager_steps"] == 0  # no graphs
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"]
        assert r["step_ms_p50"] <= r["step_ms_max"]
        assert r["gpu_util_mean_pct"] is None and r["gpu_util_reason"]  # the CPU: said why
    # 8 clients starting together: their prompts are chunks of one step (no cap on the CPU)
    assert out["max_prefill_seqs"] is None
    assert runs[("shared", 8)]["max_prefill_seqs_in_a_step"] == 8
    # the compile hooks are put back
    try:
        from triton import knobs
    except ImportError:
        return
    assert knobs.runtime.jit_post_compile_hook is None
