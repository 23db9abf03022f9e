# Shell functions shared by nsys_profile.sh and ncu_attention.sh (sourced; defines only).

# profiled_command ARGS...: -h/--help prints the calling script's header and exits; otherwise
# sets the array CMD to ARGS less a leading "--" (empty: the caller picks its default target).
profiled_command() {
  case "${1:-}" in
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    --) shift ;;
  esac
  CMD=("$@")
}

# require_tool SCRIPT TOOL HINT: exit 127 with "SCRIPT: 'TOOL' not found; HINT" if TOOL is absent.
require_tool() {
  if ! command -v "$2" >/dev/null 2>&1; then
    echo "$1: '$2' not found; $3" >&2
    exit 127
  fi
}

# run_logged LOG CMD...: run CMD, its output shown and copied to LOG; RC = CMD's exit status
# (not tee's), and a failing CMD does not end the script, so the caller can explain it.
run_logged() {
  local log=$1
  shift
  set +e
  "$@" 2>&1 | tee "$log"
  RC=${PIPESTATUS[0]}
  set -e
}
