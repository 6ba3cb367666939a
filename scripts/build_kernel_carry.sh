#!/bin/bash
# Build the small carries of the GPU kernel runs (run on your own machine, from the repo root; needs PyPI):
#   .carry/whl/             flashinfer-python 0.6.15.post1 + apache-tvm-ffi 0.1.11 (cp312), ~17 MiB: the
#                           baseline of bench/run_decode_hopper_gpu.sh and run_decode_attention_gpu.sh
#                           (bench/gpu_env.sh installs them into /tmp/site on the device)
#   .carry/llama31_8b/      config.json, a copy of bench/configs/llama31_8b.json (the SGLang runs' model)
#   .carry/xdist/           pytest-xdist + execnet, for GPU_TESTS="-n 8 ..." (the device installs them with
#                           pip install --no-index --no-deps --target /tmp/site .carry/xdist/*.whl)
# Idempotent: present wheels are not downloaded again. `.carry/` is git-ignored.
#   bash scripts/build_kernel_carry.sh        then carry .carry/whl (kernels) or .carry/llama31_8b (SGLang)
set -euo pipefail
PY=${PY:-python3}
mkdir -p .carry/whl .carry/llama31_8b .carry/xdist
cp bench/configs/llama31_8b.json .carry/llama31_8b/config.json
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .carry/whl \
  flashinfer-python==0.6.15.post1 apache-tvm-ffi==0.1.11
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .carry/xdist \
  pytest-xdist==3.8.0 execnet==2.1.2
ls -l .carry/whl .carry/llama31_8b .carry/xdist
echo "size: $(du -sm .carry/whl | cut -f1) MiB (.carry/whl)"
