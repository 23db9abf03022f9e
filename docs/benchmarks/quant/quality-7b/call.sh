#!/bin/bash
# One device call: weight quantisation quality at Llama-2-7B's shapes (synthetic weights,
# seeded: every variant quantises the same draws): top-1 agreement and KL of int8, int4 g128
# and int4 g32 against bf16 weights, 8 tokens a pass (the decode steps' kernels), bf16
# activations, on the repo's evaluation text read by the byte-level tokenizer; with DTYPE=float32
# VARIANTS=fp32,bf16: how far bf16 rounding of the same weights alone moves them.
#   [DTYPE=float32 VARIANTS=fp32,bf16 TOKENS=240 TAG=-fp32] bash docs/benchmarks/quant/quality-7b/call.sh
# (0.25 GiB of K/V an engine: 512 tokens of a 7B in bf16, 256 in float32)
set -u
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
timeout ${QUALITY_S:-300} python3 -m backend.engine.weights_quality --model synthetic:llama-2-7b \
    --device cuda --dtype ${DTYPE:-bfloat16} --variants ${VARIANTS:-bf16,int8,int4:128,int4:32} \
    --score-chunk 8 --max-tokens ${TOKENS:-448} --greedy-tokens 32 --json $OUT/quality-7b${TAG:-}.json \
    > $OUT/quality-7b${TAG:-}.log 2>&1
echo "== quality rc=$?"; grep -v "it/s" $OUT/quality-7b${TAG:-}.log | tail -5
python3 - $OUT/quality-7b${TAG:-}.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for v, f in r["perplexity"].items():
    print(v, r["formats"][v], "top1", round(f["top1_agreement"], 4), "kl", f["mean_kl_vs_full"],
          "ppl", round(f["perplexity"], 1), "tokens", f["tokens"])
print("greedy", json.dumps(r["greedy"])[:600])
PY
