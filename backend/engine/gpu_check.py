"""CUDA smoke check and decode timing (run on a GPU machine; CI never runs it).

    python -m backend.engine.gpu_check [--json PATH]

1. Correctness on CUDA: a tiny random transformers Llama (GQA) as the reference (CPU, fp32);
   our engine on CUDA in fp32 with and without CUDA graphs, 8 requests of different lengths
   with chunked prefill, must give the reference's greedy tokens, for every attention
   backend (triton, sdpa, math); int8/fp8 KV and bf16 runs are reported as agreement
   figures.
2. The engine's CPU parity tests (transformers greedy, batch invariance, paged vs
   contiguous, preemption, prefix caching) run here on CUDA for every backend.
3. Decode speed of a synthetic llama-2-7b (random weights, bf16) at batch 1 and 32, with
   and without CUDA graphs, and the attention kernel that really ran.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from backend.engine._tools import emit_json
from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams

PARITY_TESTS = ("tests/backend/engine/test_parity_backends.py",)


def correctness(only: str = "") -> dict:
    """only: run just the configurations whose name contains it (e.g. "triton")."""
    from tests.backend.tiny_models import hf_greedy, source_from_hf, tiny_hf_model

    hf = tiny_hf_model("llama")
    source = source_from_hf(hf)
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 256, (int(n),), generator=g).tolist()
               for n in torch.randint(5, 90, (8,), generator=g)]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    ref = [hf_greedy(hf, p, 24) for p in prompts]
    out = {}
    runs = {}
    for backend in ("triton", "sdpa", "math"):
        runs[f"{backend}_fp32"] = dict(dtype="float32", cuda_graph=False, attention=backend)
        runs[f"{backend}_fp32_graphs"] = dict(dtype="float32", attention=backend)
        runs[f"{backend}_bf16_graphs"] = dict(dtype="bfloat16", attention=backend)
    # every run above uses the CUDA default, async scheduling on; this one without it
    runs["triton_fp32_graphs_no_async"] = dict(dtype="float32", attention="triton",
                                               async_scheduling=False)
    for kind in ("int8", "fp8_e4m3"):
        for backend in ("triton", "sdpa"):
            runs[f"{backend}_fp32_{kind}_kv"] = dict(dtype="float32", kv_cache_dtype=kind,
                                                     attention=backend)
    for name, kw in runs.items():
        if only not in name:
            continue
        engine = LLMEngine(EngineConfig(device="cuda", kv_cache_memory_gib=0.05,
                                        max_model_len=512, max_num_batched_tokens=64,
                                        max_num_seqs=16, **kw), source)
        got = engine.generate(prompts, params)
        same = sum(a == b for a, b in zip(got, ref))
        out[name] = {"identical_to_reference": f"{same}/{len(ref)}",
                     "async_scheduling": engine.async_scheduling,
                     "kernel": engine.stats().attention_kernel,
                     "blocks_free_after": engine.block_manager.num_used == 0}
    return out


def decode_speed(preset: str = "llama-2-7b", attention: str = "triton") -> dict:
    from backend.weights.loader import synthetic_source

    source = synthetic_source(preset)
    out = {}
    for graphs in (False, True):
        engine = LLMEngine(EngineConfig(device="cuda", dtype="bfloat16", cuda_graph=graphs,
                                        max_model_len=1024, max_num_seqs=32,
                                        kv_cache_memory_gib=16, attention=attention), source)
        for batch in (1, 32):
            params = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
            for i in range(batch):
                engine.add_request(f"{graphs}-{batch}-{i}", list(range(1, 129)), params)
            engine.step()  # prefill
            engine.step()
            torch.cuda.synchronize()
            t, steps = time.perf_counter(), 0
            while engine.has_unfinished():
                engine.step()
                steps += 1
            dt = (time.perf_counter() - t) / steps
            out[f"graphs={graphs} batch={batch}"] = {"tpot_ms": dt * 1e3,
                                                     "tok_s": batch / dt}
        out["kernel"] = engine.stats().attention_kernel
        del engine
        torch.cuda.empty_cache()
    return out


def parity_tests() -> int:
    """The engine's parity tests on CUDA, every attention backend (pytest's exit code)."""
    import pytest

    return int(pytest.main(["-q", "-x", "-p", "no:cacheprovider", *PARITY_TESTS]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--skip-tests", action="store_true", help="skip the engine's parity tests")
    ap.add_argument("--skip-speed", action="store_true", help="skip the llama-2-7b timing")
    ap.add_argument("--only", default="",
                    help="correctness runs whose name contains this (e.g. triton)")
    args = ap.parse_args(argv)
    result = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
              "correctness": correctness(args.only)}
    if not args.skip_tests:
        result["parity_tests_exit_code"] = parity_tests()
    if not args.skip_speed:
        result["decode_llama_2_7b_bf16"] = decode_speed()
    emit_json(result, args.json)


if __name__ == "__main__":
    main()
