#!/bin/bash
# The AOTInductor package load on this host's CPU: a trivial package and the int8 GEMV, each
# built in one process and loaded in another (faulthandler on), with gdb's backtrace where
# gdb is installed. Output into $OUT/aoti-load.
D=$OUT/aoti-load; mkdir -p $D /tmp/aoti
export PYTHONPATH=$PWD:${PYTHONPATH:-}
c++ --version | head -1 | tee $D/compiler.txt
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, torch._C._GLIBCXX_USE_CXX11_ABI, torch.backends.cpu.get_cpu_capability())" | tee -a $D/compiler.txt
python3 -c "import torch, os; d = os.path.dirname(torch.__file__); print([f for r, _, fs in os.walk(os.path.dirname(d)) if 'torch' in r for f in fs if 'gomp' in f or 'iomp' in f][:8])" | tee -a $D/compiler.txt
for kind in trivial gemv; do
  timeout 240 python3 -X faulthandler docs/benchmarks/quant/aoti-load/probe.py build $kind /tmp/aoti > $D/build-$kind.log 2>&1
  echo "build $kind rc=$?"; tail -2 $D/build-$kind.log
  timeout 60 python3 -X faulthandler docs/benchmarks/quant/aoti-load/probe.py load $kind /tmp/aoti > $D/load-$kind.log 2>&1
  echo "load $kind rc=$?"; tail -4 $D/load-$kind.log
done
if command -v gdb > /dev/null; then
  timeout 120 gdb -q -batch -ex run -ex bt --args python3 docs/benchmarks/quant/aoti-load/probe.py load gemv /tmp/aoti > $D/gdb-gemv.log 2>&1
  grep -E "^#[0-9]+" $D/gdb-gemv.log | head -25
else
  echo "no gdb"
fi
( cd /tmp/aoti && for f in *.pt2; do mkdir -p x-$f && cd x-$f && python3 -m zipfile -e ../$f . && cd ..; done
  find . -name "*.so" | head -4 | while read so; do echo "== $so"; ldd $so | head -12; done ) > $D/ldd.txt 2>&1
find /tmp/aoti -name "*.cpp" | head -1 | xargs -r grep -n "TORCH_CHECK\|std::to_string\|fmt::" | head -20 > $D/generated-checks.txt
