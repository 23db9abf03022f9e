"""Ad hoc: install benchmarks.skinny_gemm --weights int8|int4 picks (those that beat the
format's GEMM) into skinny_gemm.INT8_CONFIGS / INT4_CONFIGS, then run
benchmarks.decode_profile (= committing them)."""
import json, sys
from backend.layers import skinny_gemm
for path in sys.argv[1].split(","):
    res = json.load(open(path))
    for r in res["layers"]:
        if not (r.get("quant_gemm_us") and r["best_us"] < r["quant_gemm_us"]):
            continue
        if r["weights"] == "int8":
            skinny_gemm.INT8_CONFIGS[(skinny_gemm.bucket(r["M"]), r["N"], r["K"])] = r["best"]
        else:
            G = res.get("group_size", 128)
            skinny_gemm.INT4_CONFIGS[(skinny_gemm.bucket(r["M"]), r["N"], r["K"], G)] = r["best"]
print("installed int8", skinny_gemm.INT8_CONFIGS, "int4", skinny_gemm.INT4_CONFIGS, flush=True)
from benchmarks import decode_profile
sys.exit(decode_profile.main(sys.argv[2:]))
