#!/bin/bash
# One device call: the sweep of "TTFT against batch size on the H200" (gateway + backend,
# synthetic Llama-2-7B, distinct 512-token prompts, 64 output tokens) once per weight format,
# bf16 K/V, the passes in turn on one machine:
#   [WEIGHTS="int4 int8 bf16"] [BATCHES=1,8,32,64,128] [PASS_S=170] [EXTRA="backend flags"] \
#   [TAG=-suffix] bash docs/benchmarks/gpu-sweep/exact-prompts/quant-weights/call.sh
# int4 is group-wise with 128 inputs a group (the one-token GEMV's fastest on the H200).
# Each pass's folder is named for its format and TAG.
set -u
WEIGHTS=${WEIGHTS:-int4 int8 bf16}
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
DIRS=""
for w in $WEIGHTS; do
  d=$w${TAG:-}
  DIRS="$DIRS $d"
  PYTHON=python3 DEMO_BACKEND_MODEL=synthetic:llama-2-7b \
  DEMO_BACKEND_ARGS="--device cuda --max-num-seqs 128 --kv-cache-memory 40 --weights-dtype $w --int4-group-size 128 ${EXTRA:-}" \
  DEMO_BATCH_SIZES=${BATCHES:-1,8,32,64,128} DEMO_REQUESTS=100 DEMO_PROMPT_TOKENS=512 \
  DEMO_OUTPUT_TOKENS=64 DEMO_SLO_MS=200 DEMO_OUT="$OUT/$d" timeout ${PASS_S:-170} deploy/demo.sh \
      > "$OUT/sweep-$d.log" 2>&1
  echo "== $d rc=$?"
  python3 docs/benchmarks/gpu-sweep/exact-prompts/print_rows.py "$OUT/$d/results.json"
done
# the device returns at most 8 files: each pass's folder goes back as one archive
tar czf $OUT/sweep-results.tgz -C $OUT --exclude="*.jsonl" $DIRS && (cd $OUT && rm -rf $DIRS)
