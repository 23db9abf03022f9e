# Nsight Compute on the int4 g128 one-token GEMV and the bf16 GEMV, Llama-2-7B shapes (one
# call on the device; caches flushed before each profiled kernel, clocks left free).
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD
D=docs/benchmarks/quant/int4-gemv-ncu
date -u; nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem,driver_version --format=csv,noheader
which ncu || ls /usr/local/cuda*/bin/ncu
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu | head -1)
# every launch of both kernels is profiled (three warm-ups and the last call per shape);
# the output is kept as ncu.txt.gz
timeout 400 $NCU --clock-control none --cache-control all \
  -k regex:'_int4_gemv_words|_gemv$' \
  --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
  --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  --section InstructionStats \
  --metrics dram__bytes_read.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg,gpu__time_duration.sum \
  python3 $D/ncu_target.py > $OUT/ncu.txt 2>&1; echo "ncu rc=$?"
grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Issue Slots Busy|No Eligible|Block Limit|Executed Ipc A|Grid Size|Waves Per SM|dram__bytes_read|smsp__inst_executed.sum|One or More Eligible|Stall|Warp Cycles Per Issued" $OUT/ncu.txt | head -300
date -u
