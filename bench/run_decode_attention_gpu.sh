#!/usr/bin/env bash
# On the GPU machine, from the repo root: install the carried baselines (.carry/whl: flashinfer-python
# 0.6.15.post1 + apache-tvm-ffi 0.1.11; .carry/sgl: SGLang 0.5.17's Triton decode kernel files), zipkv
# itself, warm FlashInfer's JIT in the background, run the GPU tests, then the benchmark with "$@".
set -uo pipefail
EXTRA_PYTHONPATH="$PWD/.carry/sgl" source bench/gpu_env.sh
warm_flashinfer &
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
# every GPU test of the kernels, codec and pool: 29 tests (the 23 before the extend kernel took ~145 s with
# 16 workers, both page format versions; the 6 extend tests have not run on a GPU yet)
timeout "${TESTS_TIMEOUT:-220}" python3 -m pytest -q -p no:cacheprovider -n 16 -m gpu tests/kernels tests/allocator/test_pool.py \
  2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
wait
tail -2 "$OUT/flashinfer_warm.log"
timeout "${BENCH_TIMEOUT:-400}" python3 -m bench.kernels.bench_decode_attention "$@" 2>&1 | tee "$OUT/bench.log"
# EXTEND=1: also the fused extend attention against its baselines (bench/kernels/bench_extend_attention.py)
if [ -n "${EXTEND:-}" ]; then
  timeout "${EXTEND_TIMEOUT:-300}" python3 -m bench.kernels.bench_extend_attention --out "$OUT/extend_attention.json" 2>&1 \
    | tee "$OUT/extend_bench.log"
fi
