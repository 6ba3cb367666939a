#!/usr/bin/env bash
# On the GPU machine, from the repo root: the first run of the Hopper kernel with a producer partition
# (kernels/attention/hopper/specialized.py, ZIPKV_HOPPER_PRODUCER). Its smoke first, under a short timeout
# (bench/kernels/producer_smoke.py: a wrong mbarrier count hangs, and the timeout says so); if every case
# passes, the decode benchmark of its two modes (1: copies on the producer warps; 2: the pre-pass too, at two
# and three stages) beside today's kernel, then (NCU=1) the stall profile of the producer kernel at 59 x 8448
# (NCU_MODE, default 2). Carry .carry/whl (or the SGLang carry: bench/gpu_env.sh takes either).
#   bash bench/run_producer_gpu.sh          SHAPES=..., CONFIGS=..., SMOKE_CASES=0,1,3,4,5 to change them
set -uo pipefail
source "${ZIPKV_GPU_ENV:-bench/gpu_env.sh}"
warm_flashinfer &
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
timeout "${SMOKE_TIMEOUT:-200}" python3 -m bench.kernels.producer_smoke --cases "${SMOKE_CASES:-0,1,3,4,5}" \
  --out "$OUT/producer_smoke.json" 2>&1 | cut -c1-700
rc=${PIPESTATUS[0]}
wait
if [ "$rc" != 0 ]; then
  echo "producer smoke rc=$rc (124: it timed out, so the kernel hangs; 1: a case failed, see above)"
  exit 0
fi
timeout "${BENCH_TIMEOUT:-240}" python3 -m bench.kernels.bench_decode_hopper --bench \
  --configs "${CONFIGS:-32:2:0:0:2:0:0:1,64:2:2:0:4:0:0:1:0:0:1:1,64:2:2:0:4:0:0:1:0:0:1:2,64:3:2:0:4:0:0:1:0:0:1:2}" \
  --shapes "${SHAPES:-59x8448,64x8192,32x8192,128x8192,1x32768}" --out "$OUT/decode_hopper_producer.json" \
  2>&1 | cut -c1-700
if [ "${NCU:-1}" != 0 ]; then
  ZIPKV_HOPPER_PRODUCER=${NCU_MODE:-2} timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none -k regex:_decode_hopper \
    --launch-skip 2 --launch-count 1 --section WarpStateStats --section SchedulerStats --section SpeedOfLight \
    --section InstructionStats --section LaunchStats --section Occupancy \
    python3 -m bench.kernels.bench_decode_hopper --ncu "${NCU_SHAPE:-59x8448}" >"$OUT/ncu_producer.txt" 2>&1
  grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A|Stall|Warp Cycles" \
    "$OUT/ncu_producer.txt" | head -20
fi
