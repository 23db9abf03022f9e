"""The sweep end to end (Locust subprocesses through the gateway), its files, and the joins."""
import csv
import json
import subprocess
import sys

import pytest

from loadtests.decompose import decompose
from loadtests.records import steady_output_rate
from loadtests.sse import RequestRecord
from loadtests.sweep import SweepConfig, sweep_warnings

from .conftest import CLIENT_KEY, ROOT


def test_sweep_writes_csv_json_charts_and_html(lt_fake, lt_gateway, tmp_path):
    up, fake = lt_fake(ttft_ms=60, itl_ms=5, tokens=64)
    gw, gw_log = lt_gateway(up)
    out = tmp_path / "sweep"
    res = subprocess.run(
        [sys.executable, "-m", "loadtests.sweep", "--host", gw, "--model", "fast",
         "--batch-sizes", "1,2", "--requests", "12", "--prompt-tokens", "10",
         "--output-tokens", "8", "--ttft-slo-ms", "10000", "--out", str(out),
         "--gateway-log", str(gw_log), "--tokenize-url", up + "/tokenize",
         "--step-timeout", "60", "--no-progress"],
        cwd=ROOT, capture_output=True, text=True, timeout=200,
        env={**__import__("os").environ, "GATEWAY_API_KEY": CLIENT_KEY})
    assert res.returncode == 0, res.stderr[-3000:] + res.stdout[-2000:]
    assert "Largest batch size meeting TTFT p99 <= 10000 ms: 2" in res.stdout
    rows = list(csv.DictReader(open(out / "results.csv")))
    assert [int(r["batch_size"]) for r in rows] == [1, 2]
    for r in rows:
        assert int(r["requests_ok"]) >= 12 and int(r["requests_failed"]) == 0
        assert 60 <= float(r["ttft_p50_ms"]) < 160
        assert float(r["output_tok_s"]) > 0 and float(r["goodput_req_s"]) > 0
        # the decomposition columns, joined through the gateway's request log
        assert float(r["ttft_client_side_ms"]) >= 0 and float(r["ttft_upstream_ms"]) >= 55
    data = json.load(open(out / "results.json"))
    assert data["meta"]["best_batch_size"] == 2
    assert any("p99 from" in w for w in data["meta"]["warnings"])  # 12 samples < 100
    assert not any("prompts of" in w for w in data["meta"]["warnings"])
    for row in data["rows"]:
        assert row["prompt_tokens_p50"] == 10 and row["prompt_lengths_exact"] is True
        assert row["decomposition_joined"]["gateway"] == row["decomposition_joined"]["requests"]
        if not row["gpu_available"]:  # CPU machine: recorded as unavailable, never faked
            assert row["gpu_util_mean_pct"] is None and "NVML" in row["gpu"]["reason"]
        assert any(k.startswith("gateway_ttft_seconds") for k in row["gateway_means_s"])
    for png in ("ttft_vs_batch.png", "tpot_throughput_gpu.png", "ttft_decomposition.png"):
        assert (out / png).stat().st_size > 5000
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3 and "Largest batch size" in html
    assert (out / "steps" / "batch-002" / "records.jsonl").exists()
    # every request of every step carried its own prompt: a step that resent the previous
    # step's prompts would be measuring a backend's prefix cache
    prompts = [r.body["messages"][-1]["content"] for r in fake.received
               if r.path.endswith("/chat/completions")]
    assert len(prompts) >= 2 * 12 and len(set(prompts)) == len(prompts)


def _rec(rid, ttft, timings=None):
    return RequestRecord(request_id=rid, model="m", ok=True, ttft_s=ttft,
                         server_timings=timings)


def _closed_loop(tokens_per_request: int) -> list[RequestRecord]:
    """Two clients, one request after another: 10 content chunks each, 0.05 s after the
    send then every 0.1 s; the stream ends 1 s after the send. Client b starts 0.5 s later.
    The first request of each is warm-up, then two measured ones; nothing after them."""
    recs = []
    for client, offset in (("a", 0.0), ("b", 0.5)):
        for i in range(3):
            recs.append(RequestRecord(
                request_id=f"{client}{i}", model="m", phase="warmup" if i == 0 else "measure",
                t_start_unix=1000.0 + offset + i, ok=True, ttft_s=0.05, itl_s=[0.1] * 9,
                e2e_s=1.0, completion_tokens=tokens_per_request, content_chunks=10))
    recs.append(RequestRecord(request_id="x", model="m", t_start_unix=1001.2, ok=False,
                              status=500, e2e_s=0.01))
    return recs


def test_steady_output_rate_leaves_out_the_drain():
    recs = _closed_loop(10)
    # window: first measured send (1001.0) to the fourth measured end (1003.0: the failed
    # request counts towards the target, as in the generator); inside it each client
    # streams 10 tokens a second, warm-up and last requests included in part
    rate, window = steady_output_rate(recs, 4)
    assert window == pytest.approx(2.0) and rate == pytest.approx(20.0)
    # tokens from usage spread over the chunks: 2 a chunk doubles the rate
    assert steady_output_rate(_closed_loop(20), 4)[0] == pytest.approx(40.0)
    # the rate over the whole measured span includes client a's idle last half second
    ok = [r for r in recs if r.phase == "measure" and r.ok]
    span = max(r.t_start_unix + r.e2e_s for r in ok) - min(r.t_start_unix for r in ok)
    assert sum(r.completion_tokens for r in ok) / span == pytest.approx(16.0)
    assert steady_output_rate([], 3) == (None, None)
    assert steady_output_rate(recs, 0) == (None, None)


def test_decomposition_adds_up_to_the_client_ttft():
    timings = {"queue_s": 0.030, "prefill_s": 0.050, "first_token_s": 0.090}
    recs = [_rec("a", 0.100, timings), _rec("b", 0.100, timings)]
    gw = {"a": {"ttft_s": 0.095, "overhead_ttft_s": 0.001},
          "b": {"ttft_s": 0.095, "overhead_ttft_s": 0.001}}
    d = decompose(recs, gw)
    m = d["mean_s"]
    assert d["joined_gateway"] == 2 and d["joined_backend"] == 2
    assert abs(m["client side"] - 0.005) < 1e-9 and abs(m["gateway"] - 0.001) < 1e-9
    assert abs(m["gateway->backend hop"] - 0.004) < 1e-9
    assert abs(m["backend queue"] - 0.030) < 1e-9 and abs(m["prefill"] - 0.050) < 1e-9
    assert abs(m["backend other"] - 0.010) < 1e-9
    assert abs(sum(m.values()) - 0.100) < 1e-9
    no_gw = decompose(recs, {})["mean_s"]
    assert abs(no_gw["client + gateway"] - 0.010) < 1e-9


def test_prompts_of_the_wrong_length_are_flagged():
    # what a byte-level tokenizer gave before word costs were measured: 1,884-token prompts
    # for --prompt-tokens 512
    cfg = SweepConfig(host="http://x", model="m", batch_sizes=(8,), prompt_tokens=512)
    row = {"batch_size": 8, "step_failed": False, "ttft_count": 100,
           "generator_saturated": False, "timing_noise": "", "requests_failed": 0,
           "requests_ok": 100, "tokens_from_usage": 100, "gpu_available": False,
           "gpu": {"reason": "none"}, "prompt_tokens_p50": 1884, "prompt_lengths_exact": False}
    warned = sweep_warnings(cfg, [{**row, "cached_prompt_tokens_p50": 1872}])
    assert any("prompts of 1884 tokens" in w for w in warned)
    assert any("prefix cache served 1872 of 1884" in w for w in warned)
    assert not any("prompts of" in w for w in sweep_warnings(
        cfg, [{**row, "prompt_tokens_p50": 512, "prompt_lengths_exact": True}]))
