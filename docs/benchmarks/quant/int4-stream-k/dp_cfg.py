"""Ad hoc: argv[1] = JSON {bucket: {key: value}} merged into CONFIGS["int4-g128"] (a null
value removes the key); then benchmarks.decode_profile with the remaining arguments."""
import json, sys
from backend.layers import quant_kernels as qk
for m, upd in json.loads(sys.argv[1]).items():
    cfg = dict(qk.CONFIGS["int4-g128"][int(m)])
    for k, v in upd.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    qk.CONFIGS["int4-g128"][int(m)] = cfg
print("int4-g128", {m: qk.CONFIGS["int4-g128"][m] for m in (16, 32, 64, 128)}, flush=True)
from benchmarks import decode_profile
sys.exit(decode_profile.main(sys.argv[2:]))
