#!/usr/bin/env bash
# An Nsight Systems capture, on fixed inputs, then its three numbers.
#
#   deploy/nsight/nsys_profile.sh [-- CMD ...]
#
# Usual form:  nsys profile --trace=cuda,nvtx,osrt,cublas,cudnn --duration=30 --sample=cpu
#               --output=infer_profile --force-overwrite=true python inference_server.py
#           nsys stats --report cuda_gpu_kern_sum,cuda_gpu_mem_time_sum infer_profile.nsys-rep
# Its own pitfall: 30 s of a server under live traffic makes requests time out. So the program
# profiled here is deploy/nsight/replay.py (fixed prompts through the engine, warm-up first),
# and the capture is limited to its NVTX range `<prefix>:replay` with --capture-range=nvtx;
# the engine's --nvtx ranges (<prefix>:schedule|prefill|decode|sample) show inside it.
# Then `nsys stats` exports three CSV reports and summarize.py prints the gap ratio, the
# memcpy share and the launch count with pass/fail.
#
# Environment (defaults in brackets):
#   OUT_DIR [runs/nsight]  NAME [infer_profile]  NSYS [nsys]  PYTHON [python]
#   NVTX_PREFIX [infer]    capture range = ${NVTX_PREFIX}:replay (give a CMD that pushes it)
#   TRACE [cuda,nvtx,osrt,cublas,cudnn]  SAMPLE [process-tree] ('cpu' is the old
#                          spelling)  DURATION ['']: optional --duration cap, seconds
#   CUDA_GRAPH_TRACE [node]  show the kernels inside CUDA graphs (counts launches honestly)
#   NSYS_EXTRA ['']        more `nsys profile` flags, split on spaces
#   REPLAY_ARGS ['--device cuda']  arguments for the default replay.py target
set -euo pipefail

OUT_DIR=${OUT_DIR:-runs/nsight}
NAME=${NAME:-infer_profile}
NSYS=${NSYS:-nsys}
PYTHON=${PYTHON:-python}
NVTX_PREFIX=${NVTX_PREFIX:-infer}
TRACE=${TRACE:-cuda,nvtx,osrt,cublas,cudnn}
SAMPLE=${SAMPLE:-process-tree}
DURATION=${DURATION:-}
CUDA_GRAPH_TRACE=${CUDA_GRAPH_TRACE:-node}
NSYS_EXTRA=${NSYS_EXTRA:-}
REPLAY_ARGS=${REPLAY_ARGS:---device cuda}
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

# shellcheck source=deploy/nsight/common.sh
source "$HERE/common.sh"

profiled_command "$@"
if [ ${#CMD[@]} -eq 0 ]; then
  # shellcheck disable=SC2206  # REPLAY_ARGS is split on purpose
  CMD=("$PYTHON" "$HERE/replay.py" --nvtx-prefix "$NVTX_PREFIX" $REPLAY_ARGS)
fi
set -- "${CMD[@]}"
require_tool nsys_profile.sh "$NSYS" "install Nsight Systems or set NSYS=/path/to/nsys"

mkdir -p "$OUT_DIR"
report="$OUT_DIR/$NAME"
# NSYS_NVTX_PROFILER_REGISTER_ONLY=0: by default nsys matches the capture range only against
# registered NVTX strings, and torch.cuda.nvtx / the nvtx package push plain strings.
args=(--trace="$TRACE" --sample="$SAMPLE" --cuda-graph-trace="$CUDA_GRAPH_TRACE"
      --capture-range=nvtx --nvtx-capture="${NVTX_PREFIX}:replay" --capture-range-end=stop
      --env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0
      --output="$report" --force-overwrite=true)
[ -n "$DURATION" ] && args+=(--duration="$DURATION")
# shellcheck disable=SC2206
[ -n "$NSYS_EXTRA" ] && args+=($NSYS_EXTRA)

echo "+ $NSYS profile ${args[*]} $*" >&2
run_logged "$report.log" "$NSYS" profile "${args[@]}" "$@"
rc=$RC
if [ ! -f "$report.nsys-rep" ]; then
  echo "nsys_profile.sh: no $report.nsys-rep (exit $rc). Did the program push the NVTX range" \
       "'${NVTX_PREFIX}:replay'? See $report.log" >&2
  exit "$(( rc == 0 ? 1 : rc ))"
fi
"$NSYS" stats --report cuda_gpu_kern_sum,cuda_gpu_mem_time_sum,cuda_gpu_trace \
  --format csv --output "$report" --force-export=true "$report.nsys-rep"
"$PYTHON" "$HERE/summarize.py" --nsys-prefix "$report" --json "${report}_summary.json"
echo "report: $report.nsys-rep  CSVs: ${report}_cuda_gpu_*.csv  summary: ${report}_summary.json" >&2
exit "$rc"
