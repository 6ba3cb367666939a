#!/usr/bin/env bash
# On the GPU machine, from the repo root: install the carried baselines (.carry/whl: flashinfer-python
# 0.6.15.post1 + apache-tvm-ffi 0.1.11; .carry/sgl: SGLang 0.5.17's Triton decode kernel files), zipkv
# itself, warm FlashInfer's JIT in the background, run the GPU tests, then the benchmark with "$@".
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TVM_FFI_CACHE_DIR=/tmp/tvmffi
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .carry/whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.carry/sgl
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
python3 - >"$OUT/flashinfer_warm.log" 2>&1 <<'PY' &
import torch, flashinfer
ws = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "HND", use_tensor_cores=True)
i = torch.tensor([0, 2], dtype=torch.int32, device="cuda")
w.plan(i, torch.arange(2, dtype=torch.int32, device="cuda"), torch.tensor([16], dtype=torch.int32, device="cuda"),
       32, 8, 128, 16, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16, sm_scale=0.1)
w.run(torch.randn(1, 32, 128, device="cuda").bfloat16(), torch.randn(2, 2, 8, 16, 128, device="cuda").bfloat16())
torch.cuda.synchronize()
print("flashinfer warm")
PY
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw --format=csv | tee "$OUT/gpu.txt"
# every GPU test of the kernels, codec and pool: 29 tests (the 23 before the extend kernel took ~145 s with
# 16 workers, both page format versions; the 6 extend tests have not run on a GPU yet)
timeout "${TESTS_TIMEOUT:-220}" python3 -m pytest -q -p no:cacheprovider -n 16 -m gpu tests/kernels tests/allocator/test_pool.py \
  2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
wait
tail -2 "$OUT/flashinfer_warm.log"
timeout "${BENCH_TIMEOUT:-400}" python3 bench/bench_decode_attention.py "$@" 2>&1 | tee "$OUT/bench.log"
# EXTEND=1: also the fused extend attention against its baselines (bench/bench_extend_attention.py)
if [ -n "${EXTEND:-}" ]; then
  timeout "${EXTEND_TIMEOUT:-300}" python3 bench/bench_extend_attention.py --out "$OUT/extend_attention.json" 2>&1 \
    | tee "$OUT/extend_bench.log"
fi
