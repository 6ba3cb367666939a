#!/usr/bin/env bash
# On the GPU machine, from the repo root: the Hopper decode kernel's checks, benchmark and Nsight Compute
# profile in one call. Installs the carried FlashInfer wheels (.carry/whl: flashinfer-python 0.6.15.post1 +
# apache-tvm-ffi 0.1.11), or without them takes the same from the carried SGLang site (bench/gpu_env.sh), and
# zipkv, warms FlashInfer's JIT in the background while the checks run.
#   bash bench/run_decode_hopper_gpu.sh [--shapes 32x8192,...]      (NCU=0 skips the profile)
# GPU_TESTS="tests/kernels/test_merge.py ..." then runs those tests' GPU cases (-m gpu, or compiled on the
# GPU where a test has no marker) into $OUT/gpu_tests.txt.
# REQUIRE_GPU=H200: stop at once (rc 0, "SKIPPED") on any other card, so a call asking for the H200's figures
# costs seconds, not minutes, when the device tool hands out an H100.
set -uo pipefail
if [ -n "${REQUIRE_GPU:-}" ]; then
  CARD=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
  case "$CARD" in *"$REQUIRE_GPU"*) ;; *) echo "SKIPPED: this card is $CARD, not $REQUIRE_GPU"; exit 0 ;; esac
fi
source "${ZIPKV_GPU_ENV:-bench/gpu_env.sh}"  # (ZIPKV_GPU_ENV: for the script's own test)
warm_flashinfer &
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
# CHECK_JOBS: processes running the checks at once (each compiles its own kernel variants on a CPU core)
timeout "${CHECK_TIMEOUT:-240}" python3 -m bench.kernels.bench_decode_hopper --check --check-jobs "${CHECK_JOBS:-10}" \
  --out "$OUT/decode_hopper_check.json" \
  2>&1 | tee "$OUT/check.log" | grep -v "^bench " | cut -c1-400
pkill -f "multiprocessing.spawn" 2>/dev/null  # check processes the timeout left running would share the GPU
wait
tail -1 "$OUT/flashinfer_warm.log"; rm -f "$OUT/flashinfer_warm.log" "$OUT/pip.log"
timeout "${BENCH_TIMEOUT:-240}" python3 -m bench.kernels.bench_decode_hopper --bench "$@" --out "$OUT/decode_hopper.json" \
  2>&1 | tee "$OUT/bench.log" | cut -c1-600
if [ "${NCU:-1}" != 0 ]; then
  timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none -k regex:_decode_hopper --launch-skip 2 --launch-count 1 \
    --set full -o "$OUT/hopper" python3 -m bench.kernels.bench_decode_hopper --ncu "${NCU_SHAPE:-32x8192}" >"$OUT/ncu.log" 2>&1
  tail -3 "$OUT/ncu.log"; rm -f "$OUT/ncu.log"
  ncu --import "$OUT/hopper.ncu-rep" --csv --page raw 2>/dev/null | python3 -m bench.kernels.ncu_summary >"$OUT/ncu_summary.json"
  ncu --import "$OUT/hopper.ncu-rep" --page details >"$OUT/ncu_details.txt" 2>/dev/null
  # per SASS line: stall samples, excess shared wavefronts (bench/kernels/ncu_source.py)
  ncu --import "$OUT/hopper.ncu-rep" --page source --csv --print-source sass 2>"$OUT/ncu_source.err" \
    | python3 -m bench.kernels.ncu_source >"$OUT/ncu_source.json"
  head -c 300 "$OUT/ncu_source.err"; rm -f "$OUT/ncu_source.err"
  rm -f "$OUT/hopper.ncu-rep"
  grep -E "Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issue Slots Busy|Executed Ipc A" "$OUT/ncu_details.txt" | head -12
fi
if [ -n "${GPU_TESTS:-}" ]; then
  # shellcheck disable=SC2086 (a list of test paths)
  timeout "${TESTS_TIMEOUT:-200}" python3 -m pytest -q -p no:cacheprovider ${GPU_TESTS} >"$OUT/gpu_tests.txt" 2>&1
  tail -4 "$OUT/gpu_tests.txt"
fi
