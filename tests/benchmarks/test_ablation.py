"""benchmarks.ablation on the CPU: a smoke run of three rows (baseline, continuous batching,
the SLO-tuned batch) with tiny counts on a two-layer synthetic model; the JSON must hold every
column with sane values, the GPU columns "n/a" with their reason, and the markdown the table
and the floors line. Rows 1-5 run without the step's fused / compiled kernels, row 6 on (and
so row 7) with the device's defaults: on the CPU that is no Triton kernels (they would need
the interpreter) and the layer pieces compiled ahead of time where built."""
from __future__ import annotations

import json
import subprocess

from benchmarks import ablation
from benchmarks.roofline import Floors, StepCost


def test_ablation_smoke_on_cpu(tmp_path) -> None:
    out, md = tmp_path / "ablation.json", tmp_path / "ablation.md"
    assert ablation.main([
        "--model", "synthetic:tiny", "--rows", "1,3,7", "--prompt-tokens", "16",
        "--output-tokens", "4", "--requests", "2",
        "--batch1-requests", "2",
        "--concurrency", "2", "--batches", "2", "--policies", "default,priority",
        "--no-compile", "--slo-ms", "1e9", "--max-model-len", "64", "--kv-cache-memory", "0.02",
        "--weights-dtype", "bf16", "--json", str(out), "--markdown", str(md)]) == 0
    res = json.loads(out.read_text())
    assert [r["row"] for r in res["rows"]] == [1, 3, 7]
    floors = res["meta"]["floors"]
    assert floors["copy_gb_s"] > 0 and floors["matmul_tflop_s"] > 0
    for r in res["rows"]:
        for col in ablation.COLUMNS:
            assert col in r, (r["row"], col)
        assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"] < 600_000
        assert 0 < r["tpot_p50_ms"] < 600_000 and r["output_tok_s"] > 0
        assert r["ttft_count"] == r["measured"] >= 2
        # on the CPU the GPU columns are n/a, each with its reason; the roofline is measured
        for col in ("gpu_util_mean_pct", "kernel_busy_pct"):
            assert r[col] is None and r["reasons"][col]
        assert r["roofline_decode_pct"] > 0 and r["roofline_prefill_pct"] > 0
    base, batched, tuned = res["rows"]
    assert base["concurrency"] == 1 and base["config"]["scheduling"] == "static"
    assert base["config"]["attention"] == "math" and base["attention_kernel"] == "math"
    assert batched["concurrency"] == 2 and batched["config"]["scheduling"] == "continuous"
    for row in (base, batched):
        assert row["config"]["fused_ops"] is False and row["config"]["cpu_aot_kernels"] == "off"
    assert tuned["config"]["fused_ops"] is None and tuned["config"]["cpu_aot_kernels"] == "auto"
    assert tuned["config"]["async_scheduling"] is None  # the device's default
    assert base["article"]["ttft_ms"] == 320 and tuned["article"] == {}
    # the SLO is met everywhere: every policy runs every batch, the best is one of them
    points = res["tuned"]["points"]
    assert [(p["policy"], p["concurrency"]) for p in points] == [("default", 2), ("priority", 2)]
    assert all(p["meets_slo"] for p in points)
    assert tuned["output_tok_s"] == max(p["output_tok_s"] for p in points)
    check = res["floors_check"]
    assert check["ttft_floor_ms"] > 0 and check["tpot_floor_ms"] > 0
    assert check["concurrency"] == tuned["concurrency"]
    load = check["at_this_load"]  # the load's prompts on top of the decode bytes
    assert load["prefill_tokens_per_step"] == 2 * 16 / 4
    assert load["step_floor_ms"] >= check["tpot_floor_ms"]
    assert load["prompt_step_floor_ms"] >= check["ttft_floor_ms"] * 0.999
    assert "At this load" in md.read_text()
    text = md.read_text()
    assert sum(line.startswith("| ") for line in text.splitlines()) == 4  # header + 3 rows
    assert "goodput-maximising batch" in text and "~320 ms" in text


def test_the_floors_at_this_load_add_the_prompts_each_step_carries() -> None:
    """64 clients of 512-token prompts and 64 output tokens: an average step carries 64
    decodes and one prompt's 512 tokens, compute-bound on these floors; its TPOT floor is
    that step's, not the decode bytes' alone."""
    cost = StepCost(layer_params=6_000_000_000, head_params=100_000_000,
                    weight_bytes=12e9, kv_bytes_per_token=250_000)
    floors = Floors(copy_bytes_per_s=4e12, matmul_flops_per_s=700e12, matmul_n=8192,
                    dtype="bfloat16")
    w = ablation.load_floors(cost, floors, 64, 512, 64, ttft_ms=30.0, tpot_ms=16.0)
    assert w["prefill_tokens_per_step"] == 512
    flops = 2 * (6e9 * (64 + 512) + 1e8 * 64)
    assert abs(w["step_floor_ms"] - flops / 700e12 * 1e3) < 1e-9
    assert abs(w["prompt_step_floor_ms"] - 2 * (6e9 * 575 + 1e8 * 64) / 700e12 * 1e3) < 1e-9
    assert w["tpot_met"] == (16.0 <= 1.5 * w["step_floor_ms"]) and not w["ttft_met"]
    # one client: bandwidth-bound, the decode bytes' floor
    one = ablation.load_floors(cost, floors, 1, 16, 64, ttft_ms=5.0, tpot_ms=4.0)
    assert abs(one["step_floor_ms"] - (12e9 + 250_000 * 48) / 4e12 * 1e3) < 1e-9


def test_rows_in_their_own_processes_are_merged_into_one_table(tmp_path, monkeypatch) -> None:
    """--isolate-rows (the default on CUDA): rows 1 and 3 each in a fresh process, one JSON;
    a row whose process fails (injected: row 3's exits with status 3) keeps its place with
    the exit status as its reason."""
    real_run = ablation.subprocess.run

    def run(cmd, *args, **kw):
        if cmd[cmd.index("--rows") + 1] == "3":
            return subprocess.CompletedProcess(cmd, 3)
        return real_run(cmd, *args, **kw)
    monkeypatch.setattr(ablation.subprocess, "run", run)
    out, md = tmp_path / "ablation.json", tmp_path / "ablation.md"
    assert ablation.main([
        "--model", "synthetic:tiny", "--rows", "1,3", "--prompt-tokens", "16",
        "--output-tokens", "4", "--requests", "2", "--batch1-requests", "2",
        "--concurrency", "2", "--no-compile", "--max-model-len", "64",
        "--kv-cache-memory", "0.02", "--weights-dtype", "bf16", "--isolate-rows",
        "--json", str(out), "--markdown", str(md)]) == 0
    res = json.loads(out.read_text())
    assert [r["row"] for r in res["rows"]] == [1, 3]
    assert res["meta"]["isolated_rows"] and len(res["meta"]["floors_per_process"]) == 1
    first, broken = res["rows"]
    assert first["concurrency"] == 1 and first["tpot_p50_ms"] > 0
    assert broken["tpot_p50_ms"] is None and broken["error"].endswith("status 3")
    assert sum(line.startswith("| ") for line in md.read_text().splitlines()) == 3  # header, 2 rows


def test_row_groups_keep_row_7_with_row_6_and_children_get_their_own_rows() -> None:
    assert ablation.row_groups([1, 2, 6, 7]) == [[1], [2], [6, 7]]
    assert ablation.row_groups([5, 7]) == [[5], [7]]
    assert ablation.row_groups([3]) == [[3]]
    argv = ["--rows", "1,3", "--json=x.json", "--isolate-rows", "--seed", "1",
            "--markdown", "m.md", "--no-compile"]
    assert ablation.child_argv(argv) == ["--seed", "1", "--no-compile"]
