"""Real headless Locust runs of loadtests/chat.py against loopback servers."""
import csv
import subprocess
import sys

from loadtests.records import summary_path

from .conftest import CLIENT_KEY, ROOT, read_jsonl, run_locust


def _measured(records):
    return [r for r in records if r["phase"] == "measure"]


def test_locust_direct_to_fake_upstream(lt_fake, tmp_path):
    url, fake = lt_fake(ttft_ms=100, itl_ms=10, tokens=64)
    cfg = tmp_path / "config.toml"  # a config.toml: [profiling] drives the run
    cfg.write_text('[provider]\nname = "taotoken"\n[profiling]\nwarmup_runs = 2\n'
                   'measure_runs = 30\nprompt_tokens = 20\noutput_tokens = 16\n')
    records = tmp_path / "rec.jsonl"
    res = run_locust(["--host", url, "-u", "4", "-r", "4", "-t", "60s", "--model", "fake",
                      "--config", str(cfg), "--records", str(records),
                      "--csv", str(tmp_path / "st")])
    assert res.returncode == 0, res.stderr[-3000:]
    recs = read_jsonl(records)
    measured = _measured(recs)
    assert len([r for r in recs if r["phase"] == "warmup"]) == 2
    assert len(measured) >= 30 and all(r["ok"] for r in measured)
    for r in measured:  # injected TTFT 100 ms: never under it, the first token before the
        # last; the ceiling is loose because the suite shares the cores with another worker
        assert 0.100 <= r["ttft_s"] < r["e2e_s"] and r["ttft_s"] < 1.0, r["ttft_s"]
        assert r["completion_tokens"] == 16 and r["tokens_source"] == "usage"
        assert r["prompt_tokens"] == 20 and len(r["itl_s"]) == 15
    body = fake.last("/chat/completions").body
    assert body["stream"] and body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 16 and body["min_tokens"] == 16 and body["ignore_eos"]
    sent_ids = {rec.headers["x-request-id"] for rec in fake.received
                if rec.path.endswith("/chat/completions")}
    assert {r["request_id"] for r in recs} <= sent_ids
    assert fake.last("/chat/completions").headers["Authorization"] == f"Bearer {CLIENT_KEY}"
    # Locust's own stats: TTFT/TPOT/E2E rows per model, and a Total that counts requests once.
    rows = {(r["Type"], r["Name"]): r for r in csv.DictReader(open(tmp_path / "st_stats.csv"))}
    n_post = int(rows[("POST", "fake")]["Request Count"])
    for kind in ("TTFT", "TPOT", "E2E"):
        assert int(rows[(kind, "fake")]["Request Count"]) == n_post
    assert int(rows[("", "Aggregated")]["Request Count"]) == n_post
    assert 90 <= float(rows[("TTFT", "fake")]["50%"]) <= 200
    summary = __import__("json").load(open(summary_path(str(records))))
    assert summary["requests"]["ok"] >= 30 and summary["metrics"]["ttft_s"]["count"] >= 30
    assert summary["settings"]["measure_requests"] == 30 and "api_key" not in summary["settings"]
    assert "generator" in summary and "saturated" in summary["generator"]


def test_locust_through_the_gateway_joins_by_request_id(lt_fake, lt_gateway, tmp_path):
    up, _ = lt_fake(ttft_ms=100, itl_ms=10, tokens=64)
    gw, gw_log = lt_gateway(up)
    records = tmp_path / "rec.jsonl"
    res = run_locust(["--host", gw, "-u", "2", "-r", "2", "-t", "60s", "--model", "fast",
                      "--prompt-tokens", "10", "--output-tokens", "8",
                      "--tokenize-url", up + "/tokenize", "--warmup-requests", "1",
                      "--measure-requests", "12", "--records", str(records)])
    assert res.returncode == 0, res.stderr[-3000:]
    measured = _measured(read_jsonl(records))
    assert len(measured) >= 12 and all(r["ok"] for r in measured), measured[:1]
    for r in measured:  # as above, through the gateway
        assert 0.100 <= r["ttft_s"] < r["e2e_s"] and r["ttft_s"] < 1.0, r["ttft_s"]
        assert r["tokens_source"] == "usage" and r["completion_tokens"] == 8
    import time
    deadline = time.monotonic() + 10  # the gateway flushes its request log every second
    while time.monotonic() < deadline:
        logged = {row["request_id"]: row for row in read_jsonl(gw_log)} if gw_log.exists() else {}
        if all(r["request_id"] in logged for r in measured):
            break
        time.sleep(0.2)
    assert all(r["request_id"] in logged for r in measured)
    for r in measured:  # the gateway's TTFT sits inside the client's
        assert logged[r["request_id"]]["ttft_s"] <= r["ttft_s"]


def test_custom_arguments_show_in_the_web_ui():
    # In a subprocess: importing locust monkey-patches the whole interpreter (gevent), which
    # must not happen inside the shared pytest process.
    code = """
from locust.argument_parser import get_parser
from loadtests.settings import add_arguments
p = get_parser(); add_arguments(p)
print(sorted(p.args_included_in_web_ui), sorted(p.secret_args_included_in_web_ui))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    for name in ("model", "prompt_tokens", "output_tokens", "api_key", "records", "arrival",
                 "rate", "measure_requests"):
        assert f"'{name}'" in out.stdout
    assert "['api_key']" in out.stdout
