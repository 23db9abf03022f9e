#!/usr/bin/env bash
# After the int8 head default: ours vs transformers, then ours vs llama.cpp Q4_1 (two rounds)
set -u
cd /work/main
D=docs/benchmarks/cpu-epyc-1204
PY=.venv/bin/python
date -u; uptime
flock /work/bench.lock $PY -m benchmarks.backend_cpu --reps 5 --out $D/head-backend-cpu-vs-transformers.json 2>&1 | grep -A4 backend_over_transformers
for r in 1 2; do
  date -u; uptime
  flock /work/bench.lock $PY -m benchmarks.backend_cpu --skip-transformers --reps 3 --decode-tokens 64 --out $D/head-ours-r$r.json 2>&1 | grep -E "decode_tok_s_median|aggregate_tok_s_median"
  /tmp/llamacpp/bin/python -m llama_cpp.server --model models/SmolLM2-135M-Instruct.Q4_1.gguf --host 127.0.0.1 --port 8001 --n_ctx 2048 --n_threads 2 --n_threads_batch 2 --interrupt_requests False > /tmp/llamacpp-server-h$r.log 2>&1 &
  LP=$!
  for i in $(seq 60); do curl -s -o /dev/null http://127.0.0.1:8001/v1/models && break; sleep 1; done
  flock /work/bench.lock $PY -m benchmarks.backend_cpu --skip-transformers --reps 3 --decode-tokens 64 --peer-url http://127.0.0.1:8001 --out $D/head-llama-cpp-r$r.json 2>&1 | grep -E "decode_tok_s_median|aggregate_tok_s_median"
  kill $LP; wait $LP 2>/dev/null
done
date -u; uptime
