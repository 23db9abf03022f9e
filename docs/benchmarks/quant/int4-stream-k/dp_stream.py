"""Ad hoc: argv[1] = programs per multiprocessor for the int4 g128 GEMM as stream-K at
64 tokens (0: the tile grid everywhere, as before stream-K); then benchmarks.decode_profile
with the remaining arguments."""
import sys
from backend.layers import quant_kernels as qk
p = int(sys.argv[1])
cfg = dict(qk.CONFIGS["int4-g128"][64])
cfg.pop("STREAM_K", None)
if p:
    cfg["STREAM_K"] = p
qk.CONFIGS["int4-g128"][64] = cfg
print("int4-g128 @64", cfg, flush=True)
from benchmarks import decode_profile
sys.exit(decode_profile.main(sys.argv[2:]))
