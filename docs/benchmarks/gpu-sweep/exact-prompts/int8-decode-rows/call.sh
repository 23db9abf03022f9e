#!/bin/bash
# One device call (H200): the sweep of "TTFT against batch size on the H200" at batch 64 and
# 128 with an int8 KV cache, then with bf16 K/V (the same command), then the engine section
# with both cache dtypes; with ABLATION=1 the ablation table last (rows 1-7, batches 8-64).
#   [KVS="int8 auto"] [BATCHES=64,128] [PASS_S=200] [SKIP_ENGINE=1] [ABLATION=1] bash docs/benchmarks/gpu-sweep/exact-prompts/int8-decode-rows/call.sh
set -u
KVS=${KVS:-int8 auto}
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
for kv in $KVS; do
  PYTHON=python3 DEMO_BACKEND_MODEL=synthetic:llama-2-7b \
  DEMO_BACKEND_ARGS="--device cuda --max-num-seqs 128 --kv-cache-memory 40 --kv-cache-dtype $kv" \
  DEMO_BATCH_SIZES=${BATCHES:-64,128} DEMO_REQUESTS=100 DEMO_PROMPT_TOKENS=512 \
  DEMO_OUTPUT_TOKENS=64 DEMO_SLO_MS=200 DEMO_OUT="$OUT/$kv" timeout ${PASS_S:-200} deploy/demo.sh \
      > "$OUT/sweep-$kv.log" 2>&1
  echo "== $kv rc=$?"; grep -E "^\|" "$OUT/sweep-$kv.log" | tail -4
  python3 docs/benchmarks/gpu-sweep/exact-prompts/print_rows.py "$OUT/$kv/results.json"
done
# the device returns at most 8 files: each pass's folder goes back as one archive
tar czf $OUT/sweep-results.tgz -C $OUT --exclude="*.jsonl" $KVS && (cd $OUT && rm -rf $KVS)
[ -n "${SKIP_ENGINE:-}" ] || timeout 170 python3 -m benchmarks.attention --sections engine --engine-backends triton \
    --engine-kv-dtypes int8,auto --skip-long-context --json $OUT/engine.json 2>&1 \
    | grep -v Warning | tail -12
if [ -n "${ABLATION:-}" ]; then
  timeout ${ABLATION_S:-200} python3 -m benchmarks.ablation --model synthetic:llama-2-7b --device cuda \
      --no-compile --batches 8,16,32,64 --json $OUT/ablation-h200.json \
      --markdown $OUT/ablation-h200.md > $OUT/ablation-h200.log 2>&1
  echo "== ablation rc=$?"; tail -16 $OUT/ablation-h200.log
fi
