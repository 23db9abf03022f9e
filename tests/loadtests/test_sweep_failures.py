"""The sweep when its requests fail: a clear error naming the HTTP failure, the report still
written with the failed steps marked; --api-key; the duration estimate before it starts."""
import json
import os
import subprocess
import sys

from loadtests.sweep import SweepConfig, estimate_text, parse_args

from .conftest import CLIENT_KEY, ROOT


def _sweep(gw: str, out, *extra: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "loadtests.sweep", "--host", gw, "--model", "fast",
         "--batch-sizes", "1,2", "--requests", "4", "--prompt-tokens", "10",
         "--output-tokens", "8", "--out", str(out), "--step-timeout", "60", "--no-progress",
         *extra], cwd=ROOT, capture_output=True, text=True, timeout=200, env=env)


def test_a_sweep_without_a_key_says_401_and_still_writes_the_report(lt_fake, lt_gateway,
                                                                     tmp_path):
    up, _ = lt_fake(ttft_ms=5, itl_ms=1, tokens=8)
    gw, _ = lt_gateway(up)
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_API_KEY"}
    res = _sweep(gw, tmp_path / "out", env=env)
    assert res.returncode == 1, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert "batch 1: every request failed: HTTP 401" in res.stdout, res.stdout
    assert "API key" in res.stdout
    data = json.load(open(tmp_path / "out" / "results.json"))
    assert [r["step_failed"] for r in data["rows"]] == [True, True]
    assert "HTTP 401" in data["rows"][0]["errors"][0]["error"]
    html = (tmp_path / "out" / "report.html").read_text()
    assert "failed: HTTP 401" in html
    assert CLIENT_KEY not in json.dumps(data)


def test_api_key_flag_is_used_and_never_written(lt_fake, lt_gateway, tmp_path):
    up, _ = lt_fake(ttft_ms=5, itl_ms=1, tokens=8)
    gw, _ = lt_gateway(up)
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_API_KEY"}
    res = _sweep(gw, tmp_path / "out", "--api-key", CLIENT_KEY, env=env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "estimated duration" in res.stdout
    data = json.load(open(tmp_path / "out" / "results.json"))
    assert [r["step_failed"] for r in data["rows"]] == [False, False]
    assert all(r["requests_ok"] >= 4 for r in data["rows"])
    for path in (tmp_path / "out").rglob("*"):
        if path.is_file():
            assert CLIENT_KEY.encode() not in path.read_bytes(), path


def test_api_key_defaults_to_the_environment(monkeypatch):
    monkeypatch.setenv("GATEWAY_API_KEY", "sk-from-env")
    assert parse_args(["--host", "http://h"]).api_key == "sk-from-env"
    assert parse_args(["--host", "http://h", "--api-key", "sk-flag"]).api_key == "sk-flag"


def test_the_default_sweep_states_its_duration_from_its_settings():
    cfg = SweepConfig(host="http://h")  # the defaults: 6 batch sizes, 100 requests each
    text = estimate_text(cfg, probe_e2e_s=2.0)
    # warm-up = batch size, so sum over b of ceil((100 + b) / b) * 2 s
    expected = sum(-(-(100 + b) // b) * 2.0 for b in (1, 2, 4, 8, 16, 32))
    assert f"{expected / 60:.0f} min" in text
    assert "6 batch sizes" in text and "600 s" in text
    assert "unknown" in estimate_text(cfg, probe_e2e_s=None)
