#!/bin/bash
# Decode steps of the engine's defaults (steps.py: 512-token prompt, 50 steps timed at
# contexts 517-566), a checkout of the tree before (OLD, e.g. `git worktree add /tmp/wt-old
# 342b981`, its kernels built: `python -m backend.engine.build_kernels --model
# smollm2-135m-instruct` there) and this tree, each its own process, alternating N times.
#   OLD=/tmp/wt-old N=6 R=3 bash docs/benchmarks/cpu-avx2-1207/one-call/trees_ab.sh > OUT.jsonl
here=$(pwd); py=$here/.venv/bin/python
for i in $(seq 1 ${N:-6}); do
  for t in old new; do
    d=$here; [ $t = old ] && d=$OLD
    (cd $d && PYTHONPATH=. $py $here/docs/benchmarks/cpu-avx2-1207/paged-decode-2/steps.py ${R:-3} "" \
      2>/dev/null | sed "s/^/{\"tree\": \"$t\", \"i\": $i, \"r\": /; s/$/}/")
  done
done
