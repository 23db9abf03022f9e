# Shell functions shared by deploy/demo.sh and deploy/run_local.sh (sourced; defines only).
# The caller sets PYTHON and an array `pids` of the background servers it starts, and may set
# WAIT_PREFIX (put before wait_for's messages) and WAIT_EXIT_HINT (after its "exited" message).

# Stop every server in `pids` (SIGTERM, so the gateway drains its streams) and reap them.
# Meant for `trap stop INT TERM EXIT`; it clears the trap first so it runs once.
stop() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
}

# wait_for URL SECONDS PID: poll URL every 0.5 s until it answers; fail early if PID exits.
wait_for() {
  local url=$1 secs=$2 pid=$3
  for _ in $(seq 1 "$((secs * 2))"); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "${WAIT_PREFIX:-}process for $url exited${WAIT_EXIT_HINT:-}" >&2; return 1
    fi
    if "$PYTHON" -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=1)" "$url" 2>/dev/null; then return 0; fi
    sleep 0.5
  done
  echo "${WAIT_PREFIX:-}timed out waiting for $url" >&2; return 1
}
