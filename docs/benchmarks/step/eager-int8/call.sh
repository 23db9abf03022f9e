#!/bin/bash
# One device call: the eager int8 decode attention's candidates (probe.py), then the
# ablation's row 4 (ROWS) with the int8 cache split (the rule before) and unsplit on the
# probe's best tile, alternating (each run its own process), then where an eager step's
# host time goes in rows 3 and 4 (../eager-host/probe.py, the tree as committed). Into
# $OUT/ei8.
#   bash docs/benchmarks/step/eager-int8/call.sh        (carry .whl)
set -u
export PYTHONUNBUFFERED=1
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
D=$OUT/ei8; mkdir -p $D
E=docs/benchmarks/step/eager-int8
date -u
timeout ${PROBE_S:-150} python3 $E/probe.py $D/probe.json 2>&1 | grep -v -i warn | tee $D/probe.log
[ -f $D/probe.json ] || exit 1
for i in $(seq 1 ${PAIRS:-2}); do
  for mode in off on; do
    timeout ${AB_S:-70} python3 $E/ab.py $mode $D/probe.json $D/ab-$mode-$i ${ROWS:-4} \
      > $D/ab-$mode-$i.log 2>&1
    echo "== $mode $i rc=$?"; grep "^| [0-9]" $D/ab-$mode-$i.md 2>/dev/null | cut -c1-160
  done
done
date -u
[ "${HOST_S:-100}" = 0 ] && exit 0
timeout ${HOST_S:-100} env DECODE_GPU=0 python3 docs/benchmarks/step/eager-host/probe.py \
  $D/host synthetic:llama-2-7b cuda row3,row4 > $D/host.log 2>&1
echo "== host probe rc=$?"; grep '^{"config"' $D/host.log | cut -c1-300
date -u
