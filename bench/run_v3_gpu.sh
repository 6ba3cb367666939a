#!/usr/bin/env bash
# On the GPU machine, from the repo root: page format v3 end to end on the kernels in one call: the GPU tests
# (codec, portable decode and extend kernels, pool), the codec's throughput on v3 against v2 (real KV first),
# and the Hopper decode kernel's checks and benchmark grid. Carry .carry (FlashInfer wheels).
#   bash bench/run_v3_gpu.sh            (SKIP_TESTS=1 / SKIP_CODEC=1 / SKIP_HOPPER=1 to leave parts out)
set -uo pipefail
source bench/gpu_env.sh
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv,noheader
if [ -z "${SKIP_TESTS:-}" ]; then
  timeout "${TESTS_TIMEOUT:-240}" python3 -m pytest -q -p no:cacheprovider -n 16 -m gpu tests/kernels \
    tests/allocator/test_pool.py 2>&1 | tail -25 > "$OUT/gpu_tests.txt"; tail -6 "$OUT/gpu_tests.txt"
fi
if [ -z "${SKIP_CODEC:-}" ]; then
  for v in 3 2; do
    timeout 150 python3 -m bench.kernels.bench_codec --format-version $v --data real normal raw --reps 20 \
      --encode-warps 4 --decode-warps 4 --decode-page-heads 1 --out "$OUT/codec_v$v.json" 2>&1 | tail -8
  done
fi
if [ -z "${SKIP_HOPPER:-}" ]; then
  timeout 200 python3 -m bench.kernels.bench_decode_hopper --check --bench --configs 64:2,64:3 \
    --shapes "${SHAPES:-32x8192,64x8192,128x8192,32x32768,1x32768,8x8192,32x4096,64x4096,1x8192}" \
    --out "$OUT/decode_hopper.json" 2>&1 | grep -E "^bench|CHECKS|checks ok|Error" | cut -c1-700
fi
