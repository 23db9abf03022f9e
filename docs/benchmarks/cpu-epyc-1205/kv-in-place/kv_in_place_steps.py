"""A/B step by step in one process: a lone sequence's context read in place from the
KV cache when its blocks are consecutive ("in_place", the default) or gathered through
slot indices as before ("gather"), on alternate decode steps of batch 1 (16-token prompt,
contexts 17 to STEPS + 16), each step timed alone; then the time to the first token of a
512-token prompt, the two ways in turn. It times in-place.patch (tried, slower, not in
the tree): apply it first.

    git apply docs/benchmarks/cpu-epyc-1205/kv-in-place/in-place.patch
    python docs/benchmarks/cpu-epyc-1205/kv-in-place/kv_in_place_steps.py [STEPS] [ROUNDS] > OUT.json
"""
import json
import os
import statistics
import sys

from backend.layers import attention

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from copy_ab import first_token_ms, smollm2_engine, step_pairs  # noqa: E402

SLOT_RANGE = attention.slot_range


def switch(name: str) -> None:
    attention.slot_range = SLOT_RANGE if name == "in_place" else lambda *a: None


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 600
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    eng, out = smollm2_engine()
    step_pairs(eng, 1, 16, ("in_place", "gather"), switch)  # warm-up
    out["batch1"] = step_pairs(eng, 1, steps, ("in_place", "gather"), switch)
    print(out["batch1"], file=sys.stderr, flush=True)
    ttft = {"in_place": [], "gather": []}
    for r in range(rounds):
        for name in ("in_place", "gather") if r % 2 == 0 else ("gather", "in_place"):
            switch(name)
            ttft[name].append(round(first_token_ms(eng, 512), 1))
    out["first_token_ms_512"] = {**ttft, **{f"{k}_median": statistics.median(v)
                                            for k, v in ttft.items()}}
    print(out["first_token_ms_512"], file=sys.stderr, flush=True)
    switch("in_place")
    out["load_end"] = os.getloadavg()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
