"""The ablation's eager int8 row(s) with the int8 cache split outside graphs as inside them
(``off``: int8 taken out of ``triton_attention.EAGER_UNSPLIT``, the rule before) or decoded
unsplit on the probe's best small-batch tile (``on``), in this process.

    python docs/benchmarks/step/eager-int8/ab.py off|on PROBE_JSON OUT_PREFIX [ROWS]
"""
import json
import sys

from backend.layers import triton_attention as ta
from benchmarks import ablation

mode, probe, prefix = sys.argv[1:4]
rows = sys.argv[4] if len(sys.argv) > 4 else "4"
if mode == "on":
    tile, r = json.load(open(probe))["best"]
    ta.EAGER_UNSPLIT["int8"] = (tuple(tile), r)
else:
    ta.EAGER_UNSPLIT.pop("int8", None)
print("EAGER_UNSPLIT", ta.EAGER_UNSPLIT, flush=True)
sys.exit(ablation.main(["--model", "synthetic:llama-2-7b", "--device", "cuda", "--no-compile",
                        "--no-isolate-rows", "--rows", rows, "--json", prefix + ".json",
                        "--markdown", prefix + ".md"]))
