"""The int4 g128 one-token word-wise GEMV compiled for sm_90 on a host without a GPU
(``benchmarks.sass``), with its first weight loads before the wait for the previous kernel
(EARLY) and without: registers a thread, local-memory spills, cp.async (LDGSTS) and plain
global loads (LDG) before and after the wait (``griddepcontrol.wait``, ACQBULK in SASS), per
epilogue. 64 rows a program, two warps, three stages, bf16 x, as the engine launches it on
Llama-2-7B's shapes. With ``--sass-dir`` the SASS of each is kept, to compare two trees
byte for byte.

    PYTHONPATH=. python docs/benchmarks/quant/int4-early-weights/sass.py OUT_JSON [--sass-dir D]
"""
import argparse
import json
import os

import triton

from backend.layers import quant_kernels as qk
from benchmarks.sass import compile_sm90

TYPES = dict(x_ptr="*bf16", p_ptr="*i32", sm_ptr="*bf16", y_ptr="*bf16", part_ptr="*fp32",
             cnt_ptr="*i32", nw_ptr="*bf16", ss_ptr="*fp32", res_ptr="*bf16", eps="fp32")
ALIGNED = ["x_ptr", "p_ptr", "sm_ptr", "y_ptr", "part_ptr", "cnt_ptr", "nw_ptr", "ss_ptr",
           "res_ptr", "K", "hw"]
BASE = dict(G=128, BLOCK_N=64, GROUPS=1, STAGES=3, BF16=True, PDL=True, SS_N=1)
CASES = {"plain_split": dict(EVEN=True, PARTIAL=True, EPI=qk.PLAIN),
         "plain_unsplit": dict(EVEN=True, PARTIAL=False, EPI=qk.PLAIN),
         "plain_cut_rows": dict(EVEN=False, PARTIAL=True, EPI=qk.PLAIN),
         "added": dict(EVEN=True, PARTIAL=True, EPI=qk.ADDED),
         "normed": dict(EVEN=True, PARTIAL=True, EPI=qk.NORMED)}


def summary(consts: dict, sass_path: str | None) -> dict:
    k = compile_sm90(qk._int4_gemv_words, TYPES, consts, ALIGNED, num_warps=2, num_stages=3)
    if sass_path:
        with open(sass_path, "w") as f:
            f.write(k.sass)
    lines = k.sass.splitlines()
    wait = next((i for i, s in enumerate(lines) if "ACQBULK" in s), len(lines))
    return {"registers": k.registers, "spills": k.count(r"\b(STL|LDL)\b"),
            "shared_bytes": k.shared_bytes,
            "ldg_before_wait": k.count(r"\bLDG\.", 0, wait),
            "ldg_after_wait": k.count(r"\bLDG\.", wait),
            "ldgsts": k.count(r"\bLDGSTS"),
            "instructions": k.count(r"^\s+/\*[0-9a-f]{4}\*/")}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--sass-dir")
    args = ap.parse_args()
    if args.sass_dir:
        os.makedirs(args.sass_dir, exist_ok=True)
    res = {"triton": triton.__version__, "target": "sm_90"}
    for early in (False, True):
        for name, case in CASES.items():
            if early and case["EPI"] == qk.NORMED:
                continue  # not served early (its x multiplies the norm's weight)
            tag = f"{'early' if early else 'default'}_{name}"
            path = os.path.join(args.sass_dir, tag + ".sass") if args.sass_dir else None
            res[tag] = summary(dict(BASE, **case, EARLY=early), path)
            print(tag, res[tag], flush=True)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
