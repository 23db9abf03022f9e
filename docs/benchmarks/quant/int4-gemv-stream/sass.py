"""The int4 g128 one-token GEMVs compiled for sm_90 on a host without a GPU (Triton's
bundled ptxas and cuobjdump): registers a thread, shared memory, and the loop's loads that
go through the cp.async pipeline (LDGSTS) against plain global loads (LDG), for the
word-wise GEMV of the default config and the stream GEMV with a loop per block and with
one loop across blocks (FLAT; both need ``stream-gemv.patch`` applied). 64 rows a program,
two warps, three stages, bf16 x.

    PYTHONPATH=. python docs/benchmarks/quant/int4-gemv-stream/sass.py OUT_JSON
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget

from backend.layers import quant_kernels as qk

BIN = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
PTRS = dict(x_ptr="*bf16", p_ptr="*i32", sm_ptr="*bf16", y_ptr="*bf16", part_ptr="*fp32",
            cnt_ptr="*i32")
CONSTS = dict(G=128, BLOCK_N=64, GROUPS=1, EVEN=True, STAGES=3, BF16=True, PDL=True)


def jit_fn(kernel):
    """The JITFunction under ``launch.fast``'s wrapper."""
    while not isinstance(kernel, triton.runtime.jit.JITFunction):
        kernel = kernel.fn
    return kernel


def compiled(kernel, consts: dict) -> dict:
    fn = jit_fn(kernel)
    names = fn.arg_names
    sig = {n: PTRS.get(n, "constexpr" if n in consts else "i32") for n in names}
    aligned = [n for n in list(PTRS) + ["K", "hw"] if n in names]  # as the engine's tensors
    src = triton.compiler.ASTSource(
        fn=fn, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
        attrs={(names.index(n),): [["tt.divisibility", 16]] for n in aligned})
    k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                       options=dict(num_warps=2, num_stages=3))
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(k.asm["cubin"])
        f.flush()
        usage = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-resource-usage",
                                f.name], capture_output=True, text=True).stdout
        sass = subprocess.run([os.path.join(BIN, "cuobjdump"), "--dump-sass", f.name],
                              capture_output=True, text=True).stdout
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "shared_bytes": k.metadata.shared,
            "ldgsts": len(re.findall(r"\bLDGSTS", sass)),
            "ldg": len(re.findall(r"\bLDG\.", sass)),
            "instructions": len(re.findall(r"^\s+/\*[0-9a-f]{4}\*/", sass, re.M))}


res = {"triton": triton.__version__, "target": "sm_90",
       "words": compiled(qk._int4_gemv_words, dict(CONSTS, PARTIAL=True)),
       "stream": compiled(qk._int4_gemv_stream, dict(CONSTS, FLAT=False)),
       "stream_flat": compiled(qk._int4_gemv_stream, dict(CONSTS, FLAT=True))}
print(json.dumps(res, indent=1))
json.dump(res, open(sys.argv[1], "w"), indent=1)
