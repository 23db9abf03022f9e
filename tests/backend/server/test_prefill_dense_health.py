"""/health over the real engine says whether the CPU prefill multiplies by dense copies of
the quantised weights and what they hold; a long prompt's greedy completion is the same
either way (the copies hold the per-call pass's exact values)."""
from __future__ import annotations

import json
import urllib.request

from backend.layers import cpu_int8_rows

from .conftest import copy_kernel, real_server


def _get(base: str, path: str) -> dict:
    with urllib.request.urlopen(f"{base}{path}", timeout=30) as r:
        return json.load(r)


def _complete(base: str, prompt: list[int]) -> str:
    body = json.dumps({"model": "synthetic:tiny", "prompt": prompt, "max_tokens": 8,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["choices"][0]["text"]


def test_health_reports_the_dense_prefill_copies():
    prompt = [(11 * i) % 500 + 3 for i in range(300)]  # every call above both thresholds
    seen, completions = {}, {}
    for mode in ("on", "off"):
        server = real_server("synthetic:tiny", weights_dtype="int4", lm_head_dtype="int8",
                             prefill_dense_weights=mode, max_model_len=512,
                             kv_cache_memory_gib=0.01)
        try:
            seen[mode] = _get(server.base_url, "/health")
            completions[mode] = _complete(server.base_url, prompt)
        finally:
            server.stop()
    on, off = seen["on"], seen["off"]
    assert on["prefill_kernel"] == copy_kernel(on["dtype"])
    assert off["prefill_kernel"] == "cpu-dequant+F.linear"
    for h in (on, off):  # decode keeps the packed kernel (or the int4 x int8 op) either way
        op = h["cpu_aot_kernels"]["int4_w4a8"]["status"] in ("loaded", "built")
        decode = "cpu-int4-w4a8x2" if op else "torch._weight_int4pack_mm_for_cpu"
        assert h["linear_kernel"] == h["one_token_kernel"] == decode
    d_on, d_off = on["prefill_dense_weights"], off["prefill_dense_weights"]
    # 2 blocks x (qkv, o, gate_up, down) + the int8 head, but where its kernel serves every
    # row count (``cpu_int8_rows``, CPUs without AVX-512) and the head keeps no copy
    head_copy = int(on["lm_head_kernel"] != cpu_int8_rows.KERNEL_NAME)
    assert (d_on["mode"], d_on["enabled"], d_on["layers"], d_on["max_bytes"]) == (
        "on", True, 8 + head_copy, None)
    assert (d_off["mode"], d_off["enabled"], d_off["layers"], d_off["bytes"]) == (
        "off", False, 0, 0)
    assert d_on["bytes"] == d_on["needed_bytes"] == d_off["needed_bytes"] > 0
    assert completions["on"] == completions["off"]
