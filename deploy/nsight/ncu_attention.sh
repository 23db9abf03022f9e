#!/usr/bin/env bash
# An Nsight Compute capture of the attention kernels, on fixed inputs, then five thresholds.
#
#   deploy/nsight/ncu_attention.sh [-- CMD ...]
#
# Usual form:  ncu --kernel-name regex:attention|flash --launch-count 10 --set full --launch-skip 5
#               -o attention_profile python inference_server.py
#           ncu --import attention_profile.ncu-rep --page details
# Here the profiled program defaults to the fixed-input replay of the engine
# (deploy/nsight/replay.py --device cuda) instead of a server taking live traffic: ncu replays
# every profiled kernel many times (--set full), which would time out real requests.
# The details page is also exported as CSV and read by summarize.py.
# ncu saves and restores the device memory a kernel may touch for each of its ~40 replay
# passes, so the default target sizes the KV cache small (REPLAY_ARGS); a KV cache sized from
# free memory (100+ GiB on a big GPU) makes every profiled kernel take minutes.
#
# Environment (defaults in brackets):
#   OUT_DIR [runs/nsight]  NAME [attention_profile]  NCU [ncu]  PYTHON [python]
#   KERNEL_REGEX ['attention|flash']  LAUNCH_SKIP [5]  LAUNCH_COUNT [10]  NCU_SET [full]
#   CLOCK_CONTROL [base]  ncu's --clock-control: 'base' locks clocks (ncu's default, repeatable);
#                         'none' leaves them alone (use it where clocks may not be locked)
#   NVTX_INCLUDE ['']     e.g. 'infer:replay/': only kernels inside that NVTX push/pop range
#   NCU_EXTRA ['']        more ncu flags, split on spaces (e.g. '--replay-mode application')
#   REPLAY_ARGS ['--device cuda --kv-cache-memory 2']  arguments for the default replay.py
set -euo pipefail

OUT_DIR=${OUT_DIR:-runs/nsight}
NAME=${NAME:-attention_profile}
NCU=${NCU:-ncu}
PYTHON=${PYTHON:-python}
KERNEL_REGEX=${KERNEL_REGEX:-attention|flash}
LAUNCH_SKIP=${LAUNCH_SKIP:-5}
LAUNCH_COUNT=${LAUNCH_COUNT:-10}
NCU_SET=${NCU_SET:-full}
CLOCK_CONTROL=${CLOCK_CONTROL:-base}
NVTX_INCLUDE=${NVTX_INCLUDE:-}
NCU_EXTRA=${NCU_EXTRA:-}
REPLAY_ARGS=${REPLAY_ARGS:---device cuda --kv-cache-memory 2}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# shellcheck source=deploy/nsight/common.sh
source "$HERE/common.sh"

profiled_command "$@"
if [ ${#CMD[@]} -eq 0 ]; then
  # shellcheck disable=SC2206  # REPLAY_ARGS is split on purpose
  CMD=("$PYTHON" "$HERE/replay.py" $REPLAY_ARGS)
fi
set -- "${CMD[@]}"
require_tool ncu_attention.sh "$NCU" "install Nsight Compute or set NCU=/path/to/ncu"

mkdir -p "$OUT_DIR"
report="$OUT_DIR/$NAME"
args=(--kernel-name "regex:${KERNEL_REGEX}" --launch-skip "$LAUNCH_SKIP"
      --launch-count "$LAUNCH_COUNT" --set "$NCU_SET" --clock-control "$CLOCK_CONTROL"
      --force-overwrite -o "$report")
if [ -n "$NVTX_INCLUDE" ]; then
  args+=(--nvtx --nvtx-include "$NVTX_INCLUDE")
fi
# shellcheck disable=SC2206  # NCU_EXTRA is split on purpose
[ -n "$NCU_EXTRA" ] && args+=($NCU_EXTRA)

echo "+ $NCU ${args[*]} $*" >&2
run_logged "$report.log" "$NCU" "${args[@]}" "$@"
rc=$RC
if grep -q "ERR_NVGPUCTRPERM" "$report.log"; then
  echo "ncu_attention.sh: no access to GPU performance counters. On the host: run as root or set" \
       "NVreg_RestrictProfilingToAdminUsers=0; in a container: --cap-add SYS_ADMIN" \
       "(docs/PROFILING.md)." >&2
fi
if [ ! -f "$report.ncu-rep" ]; then
  echo "ncu_attention.sh: ncu wrote no report (exit $rc); see $report.log" >&2
  exit "$(( rc == 0 ? 1 : rc ))"
fi
"$NCU" --import "$report.ncu-rep" --csv --page details > "${report}_details.csv"
"$PYTHON" "$HERE/summarize.py" --ncu-csv "${report}_details.csv" --json "${report}_summary.json"
echo "report: $report.ncu-rep  details: ${report}_details.csv  summary: ${report}_summary.json" >&2
exit "$rc"
