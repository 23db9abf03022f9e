"""POST /debug/profile on the real server and engine (synthetic tiny model, CPU build):
auth, bounds, one capture at a time, cleanup after a caller leaves, and the report."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from backend.cli import build_parser, config_from_args
from backend.engine.config import EngineConfig
from backend.profiling import chrome_trace
from backend.server import ServerConfig, create_app
from backend.server.config import PROFILE_TOKEN_ENV

from .harness import ServerThread

TOKEN = "s3cret-profile-token-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    out = tmp_path_factory.mktemp("profiles")
    mp = pytest.MonkeyPatch()
    mp.setenv(PROFILE_TOKEN_ENV, TOKEN)
    config = ServerConfig(model="synthetic:tiny", enable_profiling=True, profile_dir=str(out),
                          engine=EngineConfig(max_model_len=512, kv_cache_memory_gib=0.05))
    srv = ServerThread(lambda: create_app(config)).start()
    mp.undo()
    srv.out_dir = out
    yield srv
    srv.stop()


def post(srv: ServerThread, body: object, headers: dict | None = None,
         timeout: float = 60.0) -> httpx.Response:
    return httpx.post(f"{srv.base_url}/debug/profile", json=body,
                      headers=AUTH if headers is None else headers, timeout=timeout)


def complete(srv: ServerThread, max_tokens: int) -> httpx.Response:
    return httpx.post(f"{srv.base_url}/v1/completions", timeout=120, json={
        "model": "synthetic:tiny", "prompt": "where does the time go", "max_tokens": max_tokens, "ignore_eos": True})


def in_thread(fn, *args) -> tuple[threading.Thread, list]:
    box: list = []
    t = threading.Thread(target=lambda: box.append(fn(*args)), daemon=True)
    t.start()
    return t, box


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer wrong"},
                                     {"Authorization": TOKEN},
                                     {"Authorization": f"Basic {TOKEN}"}])
def test_without_the_right_bearer_token_is_401(server, headers):
    r = post(server, {"steps": 1}, headers)
    assert r.status_code == 401
    err = r.json()["error"]
    assert err["type"] == "authentication_error" and TOKEN not in r.text


@pytest.mark.parametrize("body,param", [
    ({}, "steps"), ({"steps": 0}, "steps"), ({"steps": 1001}, "steps"),
    ({"steps": "5"}, "steps"), ({"steps": True}, "steps"), ({"steps": 2.5}, "steps"),
    ({"steps": 5, "timeout_s": 0}, "timeout_s"), ({"steps": 5, "timeout_s": 601}, "timeout_s"),
    ({"steps": 5, "seconds": 30}, "seconds"), ([5], None)])
def test_bad_bodies_are_400(server, body, param):
    r = post(server, body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_captures_the_next_steps_under_traffic(server, caplog):
    caplog.set_level(logging.DEBUG)
    prof, box = in_thread(post, server, {"steps": 5, "timeout_s": 60})
    time.sleep(0.3)  # the capture is armed; it starts with the next engine step
    gen = complete(server, 24)
    prof.join(60)
    assert gen.status_code == 200, gen.text
    r = box[0]
    assert r.status_code == 200, r.text
    doc = r.json()
    # CPU build: the GPU numbers are null, each with the reason; the ranges are measured.
    for key in ("kernel_gap_ratio", "memcpy_share", "kernels_per_step"):
        assert doc[key] is None and "CPU" in doc["reasons"][key]
    assert doc["steps"] == 5 and doc["capture"]["steps_captured"] == 5
    assert doc["ranges"]["engine_step"]["calls"] == 5
    for stage in ("schedule", "forward", "sample", "attention"):
        assert doc["ranges"][stage]["calls"] >= 5, stage
    assert "kernel gap ratio not measured" in doc["summary"]
    trace = Path(doc["trace"])
    assert trace.parent == server.out_dir and trace.is_file()
    again = chrome_trace.load(trace)  # a chrome trace that the summary code reads back
    assert sum(s.name == "engine_step" for s in again.spans) == 5
    assert json.loads(trace.read_text())["traceEvents"]
    assert TOKEN not in caplog.text


def test_one_capture_at_a_time_then_free_again(server):
    # An idle engine runs no steps: this capture holds the slot until its timeout.
    first, box = in_thread(post, server, {"steps": 1000, "timeout_s": 2})
    time.sleep(0.5)
    busy = post(server, {"steps": 1})
    assert busy.status_code == 409 and busy.json()["error"]["code"] == "profile_in_progress"
    first.join(30)
    doc = box[0].json()
    assert box[0].status_code == 200
    assert doc["capture"]["steps_captured"] == 0 and doc["capture"]["stopped_early"]
    assert "no engine step ran" in doc["reasons"]["kernel_gap_ratio"]
    assert post(server, {"steps": 1, "timeout_s": 0.5}).status_code == 200


def test_a_caller_that_leaves_frees_the_capture(server):
    with pytest.raises(httpx.ReadTimeout):
        post(server, {"steps": 1000, "timeout_s": 300}, timeout=1.0)
    deadline = time.monotonic() + 10
    while True:  # the server notices the hang-up, ends the capture and frees the slot
        r = post(server, {"steps": 2, "timeout_s": 1})
        if r.status_code != 409 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200  # not 409, and not a 500 from a capture still armed
    # the fresh capture armed, saw no step on the idle engine and ended at its timeout
    assert r.json()["capture"]["steps_requested"] == 2


def test_route_absent_without_the_flag(fake):
    r = httpx.post(f"{fake.base_url}/debug/profile", json={"steps": 1}, headers=AUTH)
    assert r.status_code == 404


def test_flag_without_token_refuses_to_start(monkeypatch):
    monkeypatch.delenv(PROFILE_TOKEN_ENV, raising=False)
    with pytest.raises(ValueError, match=PROFILE_TOKEN_ENV):
        create_app(ServerConfig(model="synthetic:tiny", enable_profiling=True))
    env = {k: v for k, v in os.environ.items() if k != PROFILE_TOKEN_ENV}
    r = subprocess.run([sys.executable, "-m", "backend", "--model", "synthetic:tiny",
                        "--port", "0", "--enable-profiling"], capture_output=True, text=True,
                       timeout=60, env=env)
    assert r.returncode == 2 and PROFILE_TOKEN_ENV in r.stderr


def test_metrics_say_gpm_is_unavailable_on_cpu(server):
    text = httpx.get(f"{server.base_url}/metrics", timeout=30).text
    assert "backend_gpu_gpm_available 0.0" in text
    assert 'backend_gpu_gpm_info{reason="the engine runs on \'cpu\': no GPU to sample"} 1.0' \
        in text
    assert "backend_gpu_sm_active_ratio" not in text  # absent, never a silent zero


def test_flags_map_onto_the_server_config():
    c = config_from_args(build_parser().parse_args(["--enable-profiling", "--profile-dir",
                                                    "/tmp/p"]))
    assert (c.enable_profiling, c.profile_dir) == (True, "/tmp/p")
    d = config_from_args(build_parser().parse_args([]))
    assert (d.enable_profiling, d.profile_dir) == (False, "runs/profiles")


def test_sweep_asks_for_a_profile_under_load(server, tmp_path) -> None:
    """The sweep's LoadedProfile posts to the live backend once enough measured requests
    are recorded and turns the answer into the kernel-busy columns: on the CPU build the
    capture holds steps but no GPU activity, so the column is empty with the reason; a
    wrong token leaves it empty with the HTTP error."""
    from loadtests.sweep import LoadedProfile, SweepConfig

    records = tmp_path / "records.jsonl"
    records.write_text('{"phase":"measure"}\n')
    url = f"{server.base_url}/debug/profile"
    cfg = SweepConfig(host=server.base_url, requests=8, profile_url=url, profile_steps=2,
                      profile_token=TOKEN)
    early = LoadedProfile(cfg, str(records)).start()
    time.sleep(0.5)  # one measured request of the two that trigger it
    assert not early.asked.is_set()
    assert early.result()["kernel_busy_reason"] == \
        "the load ended before the profile was asked for"
    records.write_text('{"phase":"measure"}\n' * 2)
    load, _ = in_thread(complete, server, 48)
    prof = LoadedProfile(cfg, str(records)).start()
    assert prof.asked.wait(5)
    row = prof.result()
    load.join(120)
    assert row["profile_steps_captured"] == 2 and row["kernel_busy_pct"] is None
    assert row["kernel_busy_reason"] and row["profile_trace"]
    prof.save(str(tmp_path / "profile.json"))
    saved = json.loads((tmp_path / "profile.json").read_text())
    assert saved["trace"] == row["profile_trace"] and "gap_owners" in saved
    bad = LoadedProfile(SweepConfig(host=server.base_url, requests=1, profile_url=url,
                                    profile_steps=2, profile_token="wrong"), str(records))
    assert bad.start().result()["kernel_busy_reason"].startswith("HTTP 401")
    bad.save(str(tmp_path / "none.json"))
    assert not (tmp_path / "none.json").exists()
