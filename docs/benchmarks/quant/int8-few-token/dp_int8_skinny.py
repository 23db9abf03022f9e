"""Ad hoc: install benchmarks.skinny_gemm --weights int8 picks (those that beat the int8
GEMM) into skinny_gemm.INT8_CONFIGS, then run benchmarks.decode_profile (= committing them)."""
import json, sys
from backend.layers import skinny_gemm
res = json.load(open(sys.argv[1]))
for r in res["layers"]:
    if r.get("int8_gemm_us") and r["best_us"] < r["int8_gemm_us"]:
        skinny_gemm.INT8_CONFIGS[(skinny_gemm.bucket(r["M"]), r["N"], r["K"])] = r["best"]
print("installed", skinny_gemm.INT8_CONFIGS, flush=True)
from benchmarks import decode_profile
sys.exit(decode_profile.main(sys.argv[2:]))
