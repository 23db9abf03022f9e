#!/bin/bash
# One device call: the kernel probe, then the engine with the committed decode and with the
# probe's fastest CUDA-core way for int8 (unsplit grids), alternating ROUNDS times.
#   bash docs/benchmarks/attention/decode-rows/call.sh [ROUNDS]
set -u
D=docs/benchmarks/attention/decode-rows
export PYTHONPATH=$PWD
python3 -m pip install -q --no-index --find-links .whl pydantic pydantic-core annotated-types \
    typing-inspection typing-extensions 2>&1 | tail -2
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 $D/probe.py $OUT/probe.json 2>&1 | grep -v Warning | tee $OUT/probe.log | tail -16
WAY=$(python3 - "$OUT/probe.json" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r.get("kind") == "int8"
        and r.get("splits") == 1 and "us" in r and not r["nan"] and r["rel_err_vs_dot"] < 1e-2]
def total(pred):
    got = {}
    for r in rows:
        if pred(r):
            got.setdefault((r["rows"], tuple(r["tile"])), {})[(r["batch"], r["context"])] = r["us"]
    n = max(len(v) for v in got.values())
    return {k: sum(v.values()) for k, v in got.items() if len(v) == n}
dflt = total(lambda r: r["default"])
cand = total(lambda r: r["rows"] > 0)
(rw, tile), us = min(cand.items(), key=lambda kv: kv[1])
print(f"rows:{rw}:{tile[0]}:{tile[1]}:{tile[2]}" if us < 0.97 * min(dflt.values()) else "")
PY
)
echo "picked: '${WAY}'"
if [ -n "$WAY" ]; then
  python3 $D/engine_ab.py $OUT/engine-ab-int8.json int8 ${1:-1} dot "$WAY" 2>&1 \
      | grep -v Warning | tee $OUT/engine-ab.log | tail -6
fi
