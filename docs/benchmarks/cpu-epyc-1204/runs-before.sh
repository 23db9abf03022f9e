#!/usr/bin/env bash
# CPU side by side on this VM: ours (defaults) vs transformers, then ours vs llama.cpp Q4_1, two rounds
set -u
cd /work/main
D=docs/benchmarks/cpu-epyc-1204
mkdir -p $D
PY=.venv/bin/python
lscpu | grep -E "Model name|^CPU\(s\)" > $D/machine.txt
grep -o -w -E "avx2|avx512f|avx512_bf16|avx512_vnni|amx_tile" /proc/cpuinfo | sort -u | tr '\n' ' ' >> $D/machine.txt
echo >> $D/machine.txt
date -u; uptime
flock /work/bench.lock $PY -m benchmarks.backend_cpu --reps 5 --out $D/backend-cpu-vs-transformers.json 2>&1 | tail -8
for r in 1 2; do
  date -u; uptime
  flock /work/bench.lock $PY -m benchmarks.backend_cpu --skip-transformers --reps 3 --decode-tokens 64 --out $D/ours-r$r.json 2>&1 | tail -4
  /tmp/llamacpp/bin/python -m llama_cpp.server --model models/SmolLM2-135M-Instruct.Q4_1.gguf --host 127.0.0.1 --port 8001 --n_ctx 2048 --n_threads 2 --n_threads_batch 2 --interrupt_requests False > /tmp/llamacpp-server-$r.log 2>&1 &
  LP=$!
  for i in $(seq 60); do curl -s -o /dev/null http://127.0.0.1:8001/v1/models && break; sleep 1; done
  flock /work/bench.lock $PY -m benchmarks.backend_cpu --skip-transformers --reps 3 --decode-tokens 64 --peer-url http://127.0.0.1:8001 --out $D/llama-cpp-r$r.json 2>&1 | tail -4
  kill $LP; wait $LP 2>/dev/null
done
date -u; uptime
/tmp/llamacpp/bin/pip show llama-cpp-python | grep -i version >> $D/machine.txt
