#!/bin/bash
# One device call: the ablation's rows 3-4 and the eager decode step's host cost (probe.py,
# row 3), each in this tree and in the tree before the eager-step changes (its changed
# files carried in .before/), this one first. Everything into $OUT/ab.tgz; the tables and
# per-row summaries on stdout.
#   [NEW_ROWS=3,4] [BEFORE_ROWS=3,4] [SKIP_PROBE=1] bash docs/benchmarks/step/eager-host/ab.sh
#   (carry .whl and .before). .before/ is the tree before's versions of the changed files:
#   for f in $(git diff --name-only BEFORE -- backend benchmarks); do
#     mkdir -p .before/$(dirname $f); git show BEFORE:$f > .before/$f; done
set -u
source docs/benchmarks/gpu-sweep/exact-prompts/device_env.sh
root=$PWD
rm -rf /tmp/before && mkdir -p /tmp/before
tar --exclude=./.whl --exclude=./.git --exclude=./.before -cf - . | tar -xf - -C /tmp/before
cp -r .before/. /tmp/before/
mkdir -p $OUT/ab
host() {  # tree tag
  (cd $1 && PYTHONPATH=/tmp/site:$1 DECODE_GPU=$([ $2 = new ] && echo 1 || echo 0) \
   timeout 90 python3 $root/docs/benchmarks/step/eager-host/probe.py $OUT/ab/probe-$2 \
   synthetic:llama-2-7b cuda ${PROBE_ROWS:-row3} > $OUT/ab/probe-$2.log 2>&1
   echo "== probe $2 rc=$?"; grep '^{"config"' $OUT/ab/probe-$2.log | cut -c1-200
   python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(r.get('pieces_us')); \
print(r.get('decode_gpu_us'))" $OUT/ab/probe-$2/probe.json)
}
ablation() {  # tree tag rows seconds
  (cd $1 && PYTHONPATH=/tmp/site:$1 timeout $4 python3 -m benchmarks.ablation \
   --model synthetic:llama-2-7b --device cuda --no-compile --rows $3 \
   --json $OUT/ab/ablation-$2.json --markdown $OUT/ab/ablation-$2.md \
   > $OUT/ab/ablation-$2.log 2>&1; echo "== ablation $2 rc=$?"; cat $OUT/ab/ablation-$2.md)
}
save() { tar czf $OUT/ab.tgz -C $OUT ab; }  # after each stage: a cut-off call keeps it
ablation $root new ${NEW_ROWS:-3,4} 60; save
ablation /tmp/before before ${BEFORE_ROWS:-3,4} 60; save
if [ -z "${SKIP_PROBE:-}" ]; then
  host $root new; save
  host /tmp/before before; save
fi
rm -rf $OUT/ab
