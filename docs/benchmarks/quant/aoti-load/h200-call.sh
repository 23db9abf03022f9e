#!/bin/bash
# One device call: the AOTInductor load probe on the host CPU, then int4 / int8 (dense copies
# from 65 rows, the default) against bf16 decode steps at batch 1 / 32 / 64 / 128 (copy-rows/call.sh).
#   bash docs/benchmarks/quant/aoti-load/h200-call.sh       (carry .whl)
date -u
bash docs/benchmarks/quant/aoti-load/probe.sh
RUN_S=${RUN_S:-110} TEST_S=60 CPU_TEST_S=1 bash docs/benchmarks/quant/copy-rows/call.sh \
  bf16:bf16:off:65 int4-65:int4:on:65 int8-65:int8:on:65
