"""The int4 g128 one-token GEMVs compiled for sm_90 on a host without a GPU
(``benchmarks.sass``): registers a thread, shared memory, and the loop's loads that go
through the cp.async pipeline (LDGSTS) against plain global loads (LDG), for the word-wise
GEMV of the default config and the stream GEMV with a loop per block and with one loop
across blocks (FLAT; both need ``stream-gemv.patch`` applied). 64 rows a program, two
warps, three stages, bf16 x.

    PYTHONPATH=. python docs/benchmarks/quant/int4-gemv-stream/sass.py OUT_JSON
"""
import json
import sys

import triton

from backend.layers import quant_kernels as qk
from benchmarks.sass import compile_sm90

PTRS = dict(x_ptr="*bf16", p_ptr="*i32", sm_ptr="*bf16", y_ptr="*bf16", part_ptr="*fp32",
            cnt_ptr="*i32")
CONSTS = dict(G=128, BLOCK_N=64, GROUPS=1, EVEN=True, STAGES=3, BF16=True, PDL=True)


def compiled(kernel, consts: dict) -> dict:
    k = compile_sm90(kernel, PTRS, consts, list(PTRS) + ["K", "hw"], num_warps=2,
                     num_stages=3)
    return {"registers": k.registers, "shared_bytes": k.shared_bytes,
            "ldgsts": k.count(r"\bLDGSTS"), "ldg": k.count(r"\bLDG\."),
            "instructions": k.count(r"^\s+/\*[0-9a-f]{4}\*/")}


res = {"triton": triton.__version__, "target": "sm_90",
       "words": compiled(qk._int4_gemv_words, dict(CONSTS, PARTIAL=True)),
       "stream": compiled(qk._int4_gemv_stream, dict(CONSTS, FLAT=False)),
       "stream_flat": compiled(qk._int4_gemv_stream, dict(CONSTS, FLAT=True))}
print(json.dumps(res, indent=1))
json.dump(res, open(sys.argv[1], "w"), indent=1)
