"""One short Locust run against the real backend on the embedded model, through the gateway."""
import subprocess
import sys
import time
import urllib.request

import pytest

from loadtests.decompose import decompose, read_gateway_log
from loadtests.procs import free_port, stop_process
from loadtests.records import read_records

from .conftest import ROOT, read_jsonl, run_locust

pytest.importorskip("torch")  # the backend extra; the gateway-only install has no torch


def _wait_health(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, "backend exited during start-up"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError(f"backend not healthy within {timeout_s}s")


@pytest.mark.slow
def test_locust_against_real_backend_through_gateway(lt_gateway, tmp_path):
    port = free_port()
    backend_url = f"http://127.0.0.1:{port}"
    with open(tmp_path / "backend.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "backend", "--model",
                                 "smollm2-135m-instruct", "--port", str(port),
                                 "--max-num-seqs", "4"], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        _wait_health(backend_url, proc, 240)
        gw, gw_log = lt_gateway(backend_url + "/v1", model="smollm2",
                                upstream_model="smollm2-135m-instruct")
        records = tmp_path / "real.jsonl"
        res = run_locust(["--host", gw, "-u", "2", "-r", "2", "-t", "120s", "--model",
                          "smollm2", "--prompt-tokens", "48", "--output-tokens", "6",
                          "--tokenize-url", backend_url + "/tokenize", "--warmup-requests",
                          "1", "--measure-requests", "4", "--records", str(records)],
                         timeout_s=180)
        assert res.returncode == 0, res.stderr[-3000:]
    finally:
        stop_process(proc)
    measured = [r for r in read_jsonl(records) if r["phase"] == "measure"]
    assert len(measured) >= 4 and all(r["ok"] for r in measured), measured[:1]
    for r in measured:
        assert r["prompt_tokens"] == 48  # exact length, chat template included
        assert r["completion_tokens"] == 6 and r["tokens_source"] == "usage"
        t = r["server_timings"]
        assert t and t["first_token_s"] <= r["ttft_s"]  # the backend's part sits inside
        assert t["queue_s"] + t["prefill_s"] <= t["first_token_s"] + 1e-6
    time.sleep(1.5)  # the gateway flushes its request log every second
    d = decompose(read_records(str(records)), read_gateway_log(str(gw_log)))
    assert d["joined_backend"] == d["requests"] >= 4
    assert d["mean_s"]["prefill"] > 0
