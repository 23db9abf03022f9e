#!/bin/bash
# The trivial package built on this host, loaded three ways, each in a fresh process: the raw
# loader as backend.layers.cpu_aot calls it, with its defaults, and torch._inductor's
# aoti_load_package. One log line each into $OUT/loaders.txt (the last lines of each run).
export PYTHONPATH=$PWD:${PYTHONPATH:-}
mkdir -p /tmp/aoti $OUT
P=docs/benchmarks/quant/aoti-load/probe.py
{ python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__)"
  timeout 240 python3 $P build trivial /tmp/aoti 2>&1 | tail -1
  for how in load path-only public; do
    timeout 120 python3 -X faulthandler $P $how trivial /tmp/aoti > /tmp/aoti/$how.log 2>&1
    echo "== $how rc=$?"; grep -v "^  File\|^Extension\|^$\|Warning\|return cls" /tmp/aoti/$how.log | tail -6
  done; } 2>&1 | tee $OUT/loaders.txt
