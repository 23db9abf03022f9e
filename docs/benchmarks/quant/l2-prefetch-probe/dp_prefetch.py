"""Ad hoc: argv[1] = "G:A": one-token int4 g128 / int8 GEMVs with PREFETCH=G, decode attention
with DECODE_PREFETCH=A; then benchmarks.decode_profile with the remaining arguments."""
import sys
from backend.layers import quant_kernels as qk, triton_attention as ta
g, a = (int(v) for v in sys.argv[1].split(":"))
qk.CONFIGS["int4-g128"][1] = dict(qk.CONFIGS["int4-g128"][1], PREFETCH=g)
qk.CONFIGS["int8"][1] = dict(qk.CONFIGS["int8"][1], PREFETCH=g)
for k in list(qk.INT8_FUSED):
    qk.INT8_FUSED[k] = dict(qk.INT8_FUSED[k], PREFETCH=g)
ta.DECODE_PREFETCH = bool(a)
print("prefetch", g, a, flush=True)
from benchmarks import decode_profile
sys.exit(decode_profile.main(sys.argv[2:]))
