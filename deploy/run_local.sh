#!/usr/bin/env bash
# `make run`: the local backend on the embedded model, and the gateway in front of it.
# Ctrl-C (or SIGTERM) stops both; the gateway drains its streams first.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
BACKEND_PORT=${BACKEND_PORT:-8000}
GATEWAY_PORT=${GATEWAY_PORT:-8080}
GATEWAY_CONFIG=${GATEWAY_CONFIG:-configs/gateway.yaml}
BACKEND_ARGS=${BACKEND_ARGS:-}
mkdir -p runs

if [ -z "${GATEWAY_API_KEY:-}" ]; then
  # A public, documented development key, so the quick start needs no set-up. Export your own
  # GATEWAY_API_KEY before `make run` for anything but local experiments.
  export GATEWAY_API_KEY=sk-firsttoken-local
  echo "GATEWAY_API_KEY is not set: using the development key documented in README.md"
fi

# shellcheck source=deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pids=()
trap stop INT TERM EXIT

"$PYTHON" -m backend --model smollm2-135m-instruct --host 127.0.0.1 --port "$BACKEND_PORT" $BACKEND_ARGS &
pids+=($!)
wait_for "http://127.0.0.1:$BACKEND_PORT/health" 600 "${pids[0]}"

"$PYTHON" -m gateway --config "$GATEWAY_CONFIG" --host 127.0.0.1 --port "$GATEWAY_PORT" &
pids+=($!)
wait_for "http://127.0.0.1:$GATEWAY_PORT/readyz" 60 "${pids[1]}"

cat <<MSG

firsttoken is up:
  gateway  http://127.0.0.1:$GATEWAY_PORT/v1   (model alias: smollm2; metrics at /metrics)
  backend  http://127.0.0.1:$BACKEND_PORT/v1   (model: smollm2-135m-instruct)
Try:
  curl -s http://127.0.0.1:$GATEWAY_PORT/v1/chat/completions -H "Authorization: Bearer \$GATEWAY_API_KEY" \\
    -H 'Content-Type: application/json' \\
    -d '{"model":"smollm2","messages":[{"role":"user","content":"What is the capital of France?"}]}'
Ctrl-C stops both.
MSG
wait -n "${pids[@]}"
