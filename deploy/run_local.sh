#!/usr/bin/env bash
# `make run`: the local backend on the embedded model, and the gateway in front of it.
# The backend is supervised: if it dies, it is restarted while the gateway keeps serving
# (requests to it fail with the gateway's upstream error meanwhile). Ctrl-C (or SIGTERM)
# stops both; the gateway drains its streams first.
set -euo pipefail
PYTHON=${PYTHON:-.venv/bin/python}
BACKEND_PORT=${BACKEND_PORT:-8000}
GATEWAY_PORT=${GATEWAY_PORT:-8080}
GATEWAY_CONFIG=${GATEWAY_CONFIG:-configs/gateway.yaml}
BACKEND_ARGS=${BACKEND_ARGS:-}
BACKEND_RESTART_DELAY=${BACKEND_RESTART_DELAY:-2}
export BACKEND_PORT  # configs/gateway.yaml points the `local` provider at it

# Refuse to start over someone else's server: a port that is taken is a clear error.
port_in_use() {
  "$PYTHON" -c "import socket,sys
s = socket.socket()
try:
    s.bind(('127.0.0.1', int(sys.argv[1])))
except OSError:
    sys.exit(0)
sys.exit(1)" "$1"
}
for spec in "BACKEND_PORT=$BACKEND_PORT" "GATEWAY_PORT=$GATEWAY_PORT"; do
  if port_in_use "${spec#*=}"; then
    echo "error: port ${spec#*=} (${spec%%=*}) is already in use on 127.0.0.1." >&2
    echo "Stop the process that holds it, or pick another port, e.g. make run ${spec%%=*}=$(( ${spec#*=} + 1 ))" >&2
    exit 1
  fi
done

if [ -z "${GATEWAY_API_KEY:-}" ]; then
  # A public, documented development key, so the quick start needs no set-up. Export your own
  # GATEWAY_API_KEY before `make run` for anything but local experiments.
  export GATEWAY_API_KEY=sk-firsttoken-local
  echo "GATEWAY_API_KEY is not set: using the development key sk-firsttoken-local (see README.md)."
  echo "For anything but local experiments: export GATEWAY_API_KEY=<your key> before make run."
else
  echo "Using GATEWAY_API_KEY from your environment as the client key."
fi
mkdir -p runs

# shellcheck source=deploy/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
pids=()
trap stop INT TERM EXIT
state_dir=$(mktemp -d)
ready_flag="$state_dir/backend-was-ready"

# Runs the backend, and again whenever it exits once it has been ready (a backend that never
# came up is not restarted: its exit fails `make run` with its own error above).
supervise_backend() {
  local bpid rc
  trap 'kill -TERM "$bpid" 2>/dev/null; wait "$bpid" 2>/dev/null; exit 0' INT TERM
  while true; do
    # shellcheck disable=SC2086
    "$PYTHON" -m backend --model smollm2-135m-instruct --host 127.0.0.1 --port "$BACKEND_PORT" $BACKEND_ARGS &
    bpid=$!
    rc=0
    wait "$bpid" || rc=$?
    [ -e "$ready_flag" ] || exit "$rc"
    echo "firsttoken: the backend exited (status $rc); restarting it in ${BACKEND_RESTART_DELAY}s (the gateway keeps running)" >&2
    sleep "$BACKEND_RESTART_DELAY"
  done
}
supervise_backend &
pids+=($!)
wait_for "http://127.0.0.1:$BACKEND_PORT/health" 600 "${pids[0]}"
touch "$ready_flag"

"$PYTHON" -m gateway --config "$GATEWAY_CONFIG" --host 127.0.0.1 --port "$GATEWAY_PORT" &
pids+=($!)
wait_for "http://127.0.0.1:$GATEWAY_PORT/readyz" 60 "${pids[1]}"

cat <<MSG

firsttoken is up:
  gateway  http://127.0.0.1:$GATEWAY_PORT/v1   (model alias: smollm2; metrics at /metrics)
  backend  http://127.0.0.1:$BACKEND_PORT/v1   (model: smollm2-135m-instruct; restarted if it dies)
  key      \$GATEWAY_API_KEY (the client key the gateway accepts)
Try:
  curl -s http://127.0.0.1:$GATEWAY_PORT/v1/chat/completions -H "Authorization: Bearer \$GATEWAY_API_KEY" \\
    -H 'Content-Type: application/json' \\
    -d '{"model":"smollm2","messages":[{"role":"user","content":"What is the capital of France?"}]}'
Ctrl-C stops both.
MSG
wait -n "${pids[@]}"
