#!/usr/bin/env bash
# Ours vs llama.cpp Q4_1 paired request by request (the two servers up together, order
# alternating), RUNS times, every run under the benchmark lock. D: where the JSON goes.
set -u
cd /work/main
D=${D:-docs/benchmarks/cpu-epyc-1205}
PY=.venv/bin/python
/tmp/llamacpp/bin/python -m llama_cpp.server --model models/SmolLM2-135M-Instruct.Q4_1.gguf --host 127.0.0.1 --port 8001 --n_ctx 2048 --n_threads 2 --n_threads_batch 2 --interrupt_requests False > /tmp/llamacpp-server-paired.log 2>&1 &
LP=$!
for i in $(seq 60); do curl -s -o /dev/null http://127.0.0.1:8001/v1/models && break; sleep 1; done
for r in ${RUNS:-1 2}; do
  date -u; uptime
  flock /work/bench.lock $PY -m benchmarks.backend_cpu --peer-url http://127.0.0.1:8001 --paired --reps 10 --decode-tokens 64 --out $D/paired-llama-cpp-$r.json 2>&1 | grep -v "reading"
done
kill $LP; wait $LP 2>/dev/null
date -u; uptime
