#!/bin/bash
# SGLang end to end on the H200, one command. Needs, git-ignored under .carry/: sglang/parts/site.tar.xz (a
# Python 3.12 site-packages tree of SGLang 0.5.17 and its GPU dependencies) and llama31_8b/config.json
# (a copy of bench/configs/llama31_8b.json).
# Runs, each in its own process under `timeout`: zipkv milestone 1 (small), then milestone 2 (full workload)
# for zipkv, its uncompressed twin, SGLang Triton and SGLang FlashInfer, until DEADLINE_S runs out.
# Measured on 2026-11-30: setup 20 s, zipkv m1 small 120 s (cold JIT), m2 runs 55-95 s each, FlashInfer
# needs >110 s (its own JIT): all five fit DEADLINE_S=560 in one 600 s call.
set -u
T0=$(date +%s)
mkdir -p /tmp/site && tar -C /tmp/site -xJf .carry/sglang/parts/site.tar.xz
export PYTHONPATH=/tmp/site CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH \
  FLASHINFER_WORKSPACE_BASE=/tmp/fiws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TVM_FFI_CACHE_DIR=/tmp/tvmffi \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
python3 -c "import importlib.metadata as m; print('sglang', m.version('sglang'), [e.value for e in m.entry_points(group='sglang.srt.plugins')])"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
LEFT=$(( ${DEADLINE_S:-560} - ($(date +%s) - T0) ))
python3 bench/bench_sglang_e2e.py --model .carry/llama31_8b --deadline-s "$LEFT" --timeout-s 230 \
  --runs "${RUNS:-zipkv:m1:small,zipkv:m2,zipkv_uncompressed:m2,triton:m2,flashinfer:m2}" \
  --out "$OUT/sglang_e2e.json" --logs "$OUT/logs"
for f in "$OUT"/logs/*.log; do echo "== $f"; grep -E "Traceback|Error|error:|zipkv pool|#running-req" "$f" | tail -8; done
