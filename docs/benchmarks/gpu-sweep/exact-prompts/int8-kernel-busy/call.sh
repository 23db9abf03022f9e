#!/bin/bash
# One device call (H200 only; ANY_GPU=1: whichever came): the sweep of "TTFT against batch size
# on the H200" with an int8 KV cache at batch 8-128, with 20 engine steps profiled live per
# batch size (kernel-busy); each batch size's capture summary is kept as
# int8/steps/batch-NNN/profile.json and its idle gaps' owners printed. The capture starts one
# lead step early (the work in flight when its first counted step starts is recorded).
#   [ANY_GPU=1] [BATCHES=8,16,32,64,128] bash docs/benchmarks/gpu-sweep/exact-prompts/int8-kernel-busy/call.sh
set -u
n=$(nvidia-smi --query-gpu=name --format=csv,noheader)
case "$n" in *H200*) ;; *) [ -n "${ANY_GPU:-}" ] || { echo "skipped: $n is not an H200"; exit 0; };; esac
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
PYTHON=python3 DEMO_BACKEND_MODEL=synthetic:llama-2-7b \
DEMO_BACKEND_ARGS="--device cuda --max-num-seqs 128 --kv-cache-memory 40 --kv-cache-dtype int8" \
DEMO_BATCH_SIZES=${BATCHES:-8,16,32,64,128} DEMO_REQUESTS=100 DEMO_PROMPT_TOKENS=512 \
DEMO_OUTPUT_TOKENS=64 DEMO_SLO_MS=200 DEMO_PROFILE_STEPS=20 DEMO_OUT="$OUT/int8" \
timeout ${PASS_S:-420} deploy/demo.sh > "$OUT/sweep-int8.log" 2>&1
echo "== rc=$?"; grep -E "^\|" "$OUT/sweep-int8.log" | tail -7
python3 docs/benchmarks/gpu-sweep/exact-prompts/print_rows.py "$OUT/int8/results.json" gpu_util_loaded_mean_pct kernel_busy_pct profile_steps_captured
python3 - "$OUT/int8/steps" <<'EOF'
import glob, json, sys
for p in sorted(glob.glob(sys.argv[1] + "/batch-*/profile.json")):
    r = json.load(open(p))
    owners = {k: round(v["idle_ms"], 2) for k, v in list(r["gap_owners"].items())[:4]}
    c = r.get("capture") or {}
    print(p.split("/")[-2], "steps", r["steps"], "lead", c.get("lead_steps"),
          "steps_window_ms", round(r.get("steps_window_ms") or 0, 1),
          "busy_in_steps_ms", round(r.get("gpu_busy_in_steps_ms") or 0, 1),
          "gpu_span_ms", round(r["window_ms"] or 0, 1),
          "idle_in_span_ms", round(r["gpu_idle_ms"] or 0, 2),
          "step_ms_during/outside", round(c.get("step_ms_during") or 0, 2),
          round(c.get("step_ms_outside") or 0, 2), "kernels/step",
          round(r["kernels_per_step"] or 0), "idle by range", owners)
EOF
tar czf $OUT/sweep-results.tgz -C $OUT --exclude="*.jsonl" --exclude="profiles" int8 && rm -rf $OUT/int8
