# Sourced by the bench/run_*_gpu.sh scripts on the GPU machine, from the repo root: $OUT, the CUDA and
# FlashInfer JIT environment, the carried wheels (.carry/whl, built by scripts/build_kernel_carry.sh) under
# /tmp/site, or without them the carried SGLang site (bench/carried_site.sh), zipkv itself (editable).
# The benchmarks run as modules of the package bench from the repo root (python3 -m bench.kernels.bench_codec),
# so they need no PYTHONPATH; EXTRA_PYTHONPATH is for carried third-party code (.carry/sgl).
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH
export FLASHINFER_WORKSPACE_BASE=/tmp/fiws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=14 TVM_FFI_CACHE_DIR=/tmp/tvmffi
source bench/carried_site.sh
if compgen -G ".carry/whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$ZIPKV_SITE" .carry/whl/*.whl
else
  # Without the wheels, the SGLang carry: it holds the same FlashInfer and FFI (flashinfer-python 0.6.15.post1,
  # apache-tvm-ffi 0.1.11), so one carry serves a session's kernel calls and its SGLang calls alike.
  extract_sglang_site || exit 1
fi
export PYTHONPATH=$ZIPKV_SITE${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}
python3 -m pip install -q --no-deps --no-build-isolation -e . >/tmp/pip.log 2>&1 || tail -5 /tmp/pip.log
# FlashInfer compiles its decode kernels on first use (~12 s): run this in the background while tests run.
warm_flashinfer() {
python3 - >"$OUT/flashinfer_warm.log" 2>&1 <<'PY'
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
}
