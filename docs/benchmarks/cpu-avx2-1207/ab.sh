#!/bin/bash
# In-process decode steps, alternating rounds: auto with the int4 x int8 op turned off
# (--cpu-int4-activations model: fp16 weights through fbgemm, as auto served on AVX2 before)
# against auto with it (the GGUF's int4 codes through the op, an fp16 head).
#   ROUNDS=2 OUT=DIR bash docs/benchmarks/cpu-avx2-1207/ab.sh   (from the repository root)
OUT=${OUT:-runs/cpu-avx2-ab}; mkdir -p $OUT
for r in $(seq 1 ${ROUNDS:-2}); do
  for tag in old new; do
    act=int8x2; [ $tag = old ] && act=model
    .venv/bin/python -m benchmarks.decode_profile --model smollm2-135m-instruct --device cpu \
      --weights-dtype auto --cpu-int4-activations $act --batch 1 2 4 8 16 --prompt-tokens 128 \
      --warmup 5 --baseline 30 --steps 0 --max-model-len 512 --out $OUT/x 2>/dev/null \
      | grep baseline_only | sed "s/^/{\"tag\": \"$tag\", \"round\": $r, \"row\": /; s/$/}/" >> $OUT/steps.jsonl
    tail -5 $OUT/steps.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    d=json.loads(l); r=d['row']; print(d['tag'], d['round'], r['batch_size'], round(r['step_ms_mean'],2), r['weights'], r['lm_head'], r['linear_kernel'])"
  done
done
