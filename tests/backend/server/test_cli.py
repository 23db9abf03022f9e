"""`python -m backend`: flags map onto the configs; the process serves and stops on SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

import pytest

from backend.cli import build_parser, config_from_args
from backend.server.config import ServerConfig

from .conftest import copy_kernel


def test_flags_map_onto_engine_and_server_config():
    args = build_parser().parse_args([
        "--model", "synthetic:tiny", "--device", "cuda", "--dtype", "bfloat16", "--port", "0",
        "--max-num-seqs", "8", "--max-num-batched-tokens", "512", "--scheduling", "static",
        "--attention", "math", "--kv-cache-dtype", "int8", "--kv-cache-memory", "1.5",
        "--block-size", "32", "--no-cuda-graph", "--nvtx", "--nvtx-prefix", "bench",
        "--served-model-name", "tiny", "--max-model-len", "256", "--no-prefix-caching"])
    c = config_from_args(args)
    e = c.engine
    assert (c.model, c.port, c.served_model_name) == ("synthetic:tiny", 0, "tiny")
    assert (e.device, e.dtype, e.max_num_seqs, e.max_num_batched_tokens, e.scheduling,
            e.attention, e.kv_cache_dtype, e.kv_cache_memory_gib, e.block_size, e.cuda_graph,
            e.nvtx, e.nvtx_prefix, e.max_model_len, e.enable_prefix_caching) == (
        "cuda", "bfloat16", 8, 512, "static", "math", "int8", 1.5, 32, False, True, "bench",
        256, False)
    d = config_from_args(build_parser().parse_args([]))
    assert d.model == "smollm2-135m-instruct" and d.port == 8000 and d.engine.cuda_graph
    assert d.engine.cuda_graph_max_tokens == 2048
    assert config_from_args(build_parser().parse_args(
        ["--cuda-graph-max-tokens", "0"])).engine.cuda_graph_max_tokens == 0
    assert (d.engine.weights_dtype, d.engine.int4_group_size, d.engine.lm_head_dtype) == (
        "auto", 32, "auto")
    q = config_from_args(build_parser().parse_args([
        "--weights-dtype", "int4", "--int4-group-size", "128", "--lm-head-dtype", "int8"]))
    assert (q.engine.weights_dtype, q.engine.int4_group_size, q.engine.lm_head_dtype) == (
        "int4", 128, "int8")
    assert (d.engine.prefill_dense_weights, d.engine.prefill_dense_max_gib) == ("auto", None)
    p = config_from_args(build_parser().parse_args([
        "--prefill-dense-weights", "off", "--prefill-dense-max-gib", "0.25"]))
    assert (p.engine.prefill_dense_weights, p.engine.prefill_dense_max_gib) == ("off", 0.25)
    assert d.engine.gpu_copy_min_rows is None  # the fixed crossover
    for value, rows in (("auto", "auto"), ("48", 48)):
        assert config_from_args(build_parser().parse_args(
            ["--gpu-copy-min-rows", value])).engine.gpu_copy_min_rows == rows
    assert d.engine.weights_scaling == "activation"
    assert d.engine.cpu_aot_kernels == "auto"
    assert config_from_args(build_parser().parse_args(
        ["--cpu-aot-kernels", "build"])).engine.cpu_aot_kernels == "build"
    assert config_from_args(build_parser().parse_args(
        ["--weights-scaling", "none"])).engine.weights_scaling == "none"


def test_bad_flags_are_usage_errors():
    for argv in (["--attention", "flash"], ["--block-size", "0"], ["--port", "70000"],
                 ["--weights-dtype", "int3"], ["--int4-group-size", "48"],
                 ["--max-prefill-tokens", "4096"], ["--cuda-graph-max-tokens", "-1"],
                 ["--scheduling", "static", "--prefill-priority"],
                 ["--prefill-dense-weights", "always"], ["--prefill-dense-max-gib", "-1"],
                 ["--gpu-copy-min-rows", "0"], ["--gpu-copy-min-rows", "many"],
                 ["--weights-scaling", "awq"]):
        r = subprocess.run([sys.executable, "-m", "backend", *argv], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2 and "error" in r.stderr, argv


def test_server_config_rejects_unknown_keys():
    with pytest.raises(ValueError, match="modle"):
        ServerConfig.from_dict({"modle": "x"})
    with pytest.raises(ValueError, match="kv_cache_gib"):
        ServerConfig.from_dict({"engine": {"kv_cache_gib": 1}})


def test_cli_serves_and_stops_on_sigterm(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "backend", "--model", "synthetic:tiny",
                             "--port", "0", "--max-model-len", "128", "--log-level", "WARNING",
                             "--weights-dtype", "int4", "--lm-head-dtype", "int8",
                             "--async-scheduling", "--max-prefill-tokens", "64",
                             "--prefill-priority"],
                            stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, FIRSTTOKEN_CACHE=str(tmp_path)))
    watchdog = threading.Timer(120, proc.kill)  # bounds the blocking readline below
    watchdog.start()
    try:
        line = proc.stdout.readline()  # bounded: the process prints it or exits
        assert line.startswith("backend ready on http://127.0.0.1:"), line
        base = line.split()[-1]
        with urllib.request.urlopen(f"{base}/health", timeout=30) as r:
            health = json.load(r)
        assert health["max_model_len"] == 128
        # "auto" resolves per device and CPU; /health must say what it became
        assert health["dtype"] in ("float32", "bfloat16") and health["kv_cache_dtype"] == "auto"
        # the weight format and the matmul that really runs it
        assert (health["weights_dtype"], health["linear_kernel"], health["lm_head_dtype"]) == (
            "int4-g32", "torch._weight_int4pack_mm_for_cpu", "int8")
        # the CPU runs eager step ops: one-token steps use the same packed kernel
        assert health["one_token_kernel"] == "torch._weight_int4pack_mm_for_cpu"
        # an empty weights cache holds no compiled head GEMV: torch's kernel, and how to build
        assert health["lm_head_kernel"] == "torch._weight_int8pack_mm"
        aot = health["cpu_aot_kernels"]
        assert (aot["mode"], aot["lm_head"], aot["path"]) == ("auto", "not built", None)
        assert "python -m backend.engine.build_kernels" in aot["reason"]
        assert (aot["layers"]["status"], aot["layers"]["path"]) == ("not built", None)
        few = aot["few_rows_layers"]
        assert (few["status"], few["path"], few["rows"]) == ("not built", None, [2, 8])
        # prefill multiplies by dense copies: the default auto, a tiny model within 1 GiB
        assert health["prefill_kernel"] == copy_kernel(health["dtype"])
        dense = health["prefill_dense_weights"]
        assert (dense["mode"], dense["enabled"], dense["layers"]) == ("auto", True, 9)
        assert dense["bytes"] == dense["needed_bytes"] > 0
        # the rows from which CUDA layers use the copies: nothing to time on the CPU
        assert (health["gpu_copy_rows"]["mode"], health["gpu_copy_rows"]["rows"]) == ("none", {})
        # synthetic weights: no text to calibrate on, so plain rounding, said as such
        scaling = health["weights_scaling"]
        assert (scaling["mode"], scaling["applied"]) == ("activation", False)
        assert "synthetic" in scaling["reason"]
        # overlap scheduling asked for on the CPU (its default there is off); no graphs
        assert (health["engine"]["async_scheduling"], health["engine"]["cuda_graphs"],
                health["engine"]["decode_kernels_per_step"]) == (True, None, {})
        # the step policy the scheduler runs, in the engine section
        policy = ("scheduling", "max_num_batched_tokens", "max_prefill_tokens",
                  "prefill_priority")
        assert {k: health["engine"][k] for k in policy} == {
            "scheduling": "continuous", "max_num_batched_tokens": 2048,
            "max_prefill_tokens": 64, "prefill_priority": True}
        # no graphs hold prefill steps on the CPU: no cap on the chunks of one step
        assert health["engine"]["max_prefill_seqs"] is None
        # how the work between attention calls ran: eager on the CPU by default
        assert health["compile"] == {"enabled": False, "step_ops": "eager", "pieces": [],
                                     "seconds": 0.0}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def test_serving_freezes_the_start_up_objects_out_of_garbage_collection():
    # in a child process: a freeze in the test process would follow every later test
    code = ("import gc\n"
            "from backend.server.app import freeze_startup_objects\n"
            "assert gc.get_freeze_count() == 0\n"
            "freeze_startup_objects()\n"
            "print(gc.get_freeze_count(), gc.get_threshold()[0])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    frozen, threshold = int(out[0]), int(out[1])
    assert frozen > 10_000 and threshold == 700  # the imports' objects; default threshold
