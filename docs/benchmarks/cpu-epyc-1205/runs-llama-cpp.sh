#!/usr/bin/env bash
# Ours vs llama.cpp Q4_1 (llama-cpp-python server, native build, 2 threads), two rounds,
# one server after the other, every run under the benchmark lock.
set -u
cd /work/main
D=${D:-docs/benchmarks/cpu-epyc-1205}  # where the JSON goes
PY=.venv/bin/python
/tmp/llamacpp/bin/python -c "import llama_cpp; print('llama-cpp-python', llama_cpp.__version__)"
for r in ${ROUNDS:-1 2}; do
  date -u; uptime
  flock /work/bench.lock $PY -m benchmarks.backend_cpu --skip-transformers --reps 3 --decode-tokens 64 --out $D/ours-r$r.json 2>&1 | grep -E "ttft_s_median|decode_tok_s_median|aggregate_tok_s_median"
  /tmp/llamacpp/bin/python -m llama_cpp.server --model models/SmolLM2-135M-Instruct.Q4_1.gguf --host 127.0.0.1 --port 8001 --n_ctx 2048 --n_threads 2 --n_threads_batch 2 --interrupt_requests False > /tmp/llamacpp-server-$r.log 2>&1 &
  LP=$!
  for i in $(seq 60); do curl -s -o /dev/null http://127.0.0.1:8001/v1/models && break; sleep 1; done
  flock /work/bench.lock $PY -m benchmarks.backend_cpu --skip-transformers --reps 3 --decode-tokens 64 --peer-url http://127.0.0.1:8001 --out $D/llama-cpp-r$r.json 2>&1 | grep -E "ttft_s_median|decode_tok_s_median|aggregate_tok_s_median"
  kill $LP; wait $LP 2>/dev/null
done
date -u; uptime
