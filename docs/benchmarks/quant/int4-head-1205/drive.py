"""The engine's int4 g128 decode step with the LM head in the model dtype (bf16) against an
int8 head (``--lm-head-dtype int8``), bf16 weights beside, alternating in one process.

    python docs/benchmarks/quant/int4-head-1205/drive.py OUT.json
"""
import json
import sys
import time

import torch

from benchmarks.quant import engine_level

ORDER = [("int4", "model"), ("int4", "int8"), ("bf16", "model"),
         ("int4", "int8"), ("int4", "model")]

rows = []
for weights, head in ORDER:
    r = engine_level(weights, 128, head=head, batches=(1, 64))
    r["utc"] = time.strftime("%H:%M:%S", time.gmtime())
    rows.append(r)
    print(json.dumps(r), flush=True)
with open(sys.argv[1], "w") as f:
    json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "rows": rows}, f, indent=1)
