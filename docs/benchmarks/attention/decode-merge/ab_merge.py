"""The split decode attention's merge inside the kernel (this tree) against the separate
merge kernel (the tree before: ``merge-in-kernel.patch`` reversed into /tmp), on CUDA:

1. correctness: both against the unsplit kernel at Llama-2-7B's heads (32 x 128, group 1)
   and a GQA group of 4, bf16 and int8 caches, batches 1 / 4 / 8 at 530-600-token
   contexts: relative error, the same bits over 10 launches, counters left at zero;
2. the engine's decode step (synthetic Llama-2-7B, 512-token prompts, CUDA graphs) at
   batches 1 and 8, int4 g128 and bf16 weights, the two ways alternating in one process,
   two rounds, steps timed without a sync between them.

    python ab_merge.py OLD_MODULE_PATH OUT_JSON
"""
import gc
import importlib.util
import json
import sys
import time

import torch

from backend.engine.config import EngineConfig
from backend.engine.llm_engine import LLMEngine
from backend.engine.sampling import SamplingParams
from backend.layers import splits
from backend.layers import triton_attention as new
from backend.layers.kv_cache import KVCache
from backend.weights.loader import synthetic_source

spec = importlib.util.spec_from_file_location("old_triton_attention", sys.argv[1])
old = importlib.util.module_from_spec(spec)
spec.loader.exec_module(old)
dev = torch.device("cuda")
res = {"date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
       "gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "check": [],
       "engine": []}
BS = 16


def check(kind: str, group: int, batch: int, num_splits: int) -> dict:
    gen = torch.Generator(device=dev).manual_seed(batch * 7 + group)
    kvh, hd = 32 // group, 128
    lens = [530 + (i * 37) % 70 for i in range(batch)]
    need = [-(-n // BS) for n in lens]
    cache = KVCache(1, sum(need) + 4, BS, kvh, hd, torch.bfloat16, kind, dev)
    perm = torch.randperm(sum(need) + 4, device=dev, generator=gen)[:sum(need)]
    width, rows, i = max(need), [], 0
    for nb in need:
        rows.append(perm[i:i + nb].tolist() + [0] * (width - nb))
        i += nb
    tables = torch.tensor(rows, dtype=torch.int32, device=dev)
    for r, n in enumerate(lens):
        pos = torch.arange(n, device=dev)
        slots = tables[r, pos // BS].long() * BS + pos % BS
        k = torch.randn(n, kvh, hd, device=dev, generator=gen).to(torch.bfloat16)
        v = torch.randn(n, kvh, hd, device=dev, generator=gen).to(torch.bfloat16)
        new.store_kv(k, v, slots, cache.data[0], None if cache.scales is None
                     else cache.scales[0], kind, BS)
    q = torch.randn(batch, kvh * group, hd, device=dev, generator=gen).to(torch.bfloat16)
    lens_t = torch.tensor(lens, dtype=torch.int32, device=dev)
    scales = None if cache.scales is None else cache.scales[0]

    def run(mod, splits_n):
        out = torch.empty_like(q)
        mod.paged_decode(q, cache.data[0], scales, tables, lens_t, out, hd ** -0.5, BS, kind,
                         splits_n)
        return out
    ref = run(new, 1).float()
    a, b = run(new, num_splits), run(old, num_splits)
    same = all(torch.equal(run(new, num_splits), a) for _ in range(10))
    torch.cuda.synchronize()
    err = lambda y: ((y.float() - ref).abs().max() / ref.abs().max()).item()  # noqa: E731
    return {"kind": kind, "group": group, "batch": batch, "splits": num_splits,
            "rel_err_new_vs_unsplit": err(a), "rel_err_old_vs_unsplit": err(b),
            "max_abs_new_vs_old": (a.float() - b.float()).abs().max().item(),
            "same_bits_10": same, "counters_zero": int(splits.counters(dev).abs().sum()) == 0}


for kind in ("auto", "int8"):
    for group in (1, 4):
        for batch in (1, 4, 8):
            n_splits = new.decode_splits(batch, 32 // group, None, dev)
            r = check(kind, group, batch, max(2, n_splits))
            res["check"].append(r)
            print(r, flush=True)


def engine_steps(weights: str, mode: str, rnd: int) -> dict:
    new.paged_decode = NEW_DECODE if mode == "new" else old.paged_decode
    engine = LLMEngine(EngineConfig(device="cuda", dtype="bfloat16", weights_dtype=weights,
                                    int4_group_size=128, max_num_seqs=8, max_model_len=1024,
                                    kv_cache_memory_gib=8.0, enable_prefix_caching=False),
                       synthetic_source("llama-2-7b"))
    out = {"weights": weights, "mode": mode, "round": rnd}
    for batch in (1, 8):
        params = SamplingParams(max_tokens=80, temperature=0.0, ignore_eos=True)
        for i in range(batch):
            engine.add_request(f"r{batch}-{i}", [(300 + 7 * i + j) % 30000 for j in range(512)],
                               params)
        while any(s.num_generated == 0 for s in engine.seqs.values()):
            engine.step()
        for _ in range(5):
            engine.step()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(64):
            engine.step()
        torch.cuda.synchronize()
        out[f"step_ms_batch{batch}"] = round((time.perf_counter() - t) * 1e3 / 64, 4)
        while engine.has_unfinished():
            engine.step()
    del engine
    gc.collect()
    torch.cuda.empty_cache()
    return out


NEW_DECODE = new.paged_decode
for weights in ("int4", "bf16"):
    for rnd in range(2):
        for mode in ("old", "new") if rnd == 0 else ("new", "old"):
            r = engine_steps(weights, mode, rnd)
            res["engine"].append(r)
            print(r, flush=True)
new.paged_decode = NEW_DECODE
json.dump(res, open(sys.argv[2], "w"), indent=1)
