#!/bin/bash
# The router + a Ray Serve worker replica running zipkv's SGLang engine, answering OpenAI completions through
# the router's HTTP API; one command on the GPU machine, from the repo root, with $OUT set.
#
# The GPU machine's image has no Ray and the carry limit (64 MiB a call) does not fit Ray beside SGLang, so
# this runs as the SECOND of two calls made within the machine's warm window (30 s):
#   call 1 carries .carry/sglang/parts + .carry/llama31_8b and extracts SGLang into /tmp/site
#          (bench/carried_site.sh's extract_sglang_site: bench/run_sglang_e2e_gpu.sh calls it);
#   call 2 carries .carry/ray (scripts/build_ray_carry.sh, ~22 MiB) + .carry/llama31_8b and runs this.
# If the site is missing and .carry/sglang/parts was carried, it is extracted here instead.
#
# Env: ENGINE=sglang (default) | reference (the tiny CPU model: the same path on any machine; an installed
#   Ray is used when there is one, else the carried one), MODEL (default .carry/llama31_8b for sglang),
#   KV_BUDGET_MIB (512 = 4096 tokens of Llama-3.1-8B), SGLANG_ARGS (JSON: extra sglang.Engine arguments),
#   READY_S (300: how long the replica may take to send its first report), COMPRESSION (true | false: zipkv's
#   uncompressed twin, the same pool and kernel with no page compressed), DEADLINE_S (420: the whole run),
#   DRILL=replica_faults: instead of the two requests, the replica fault drill (bench/serving/replica_faults_gpu.py:
#   a replica SIGKILLed, then its engine SIGSTOPped, mid-generation; FAULTS=kill,hang, ENGINE_STALL_S=20):
#     DRILL=replica_faults DEADLINE_S=560 bash bench/run_ray_serve_gpu.sh
# Duration (H200, 2026-11-30, call 1 ran SGLang engines so the JIT caches were warm): 103 s in all; Ray up
# in 7.7 s, the replica's first report 64.5 s after serve.run, both requests < 1 s, stop 3 s. Cold caches
# (call 1 only extracted SGLang) add ~190 s of nvcc JIT inside the replica, inside READY_S and the 420 s
# overall deadline; FlashInfer's prefill modules, part of that, now build in the background from the start.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:?set OUT to a folder for the JSON record and logs}
ENGINE=${ENGINE:-sglang}
step() { echo "[run_ray_serve_gpu $(( $(date +%s) - T0 ))s] $*"; }

PYPATH=""
if python3 -c "import ray.serve" 2>/dev/null; then
  step "using the installed Ray"
elif [ -f .carry/ray/site.tar.xz ]; then
  step "extracting Ray into /tmp/raysite"
  mkdir -p /tmp/raysite && timeout 60 tar -C /tmp/raysite -xJf .carry/ray/site.tar.xz || { echo "FAILED: Ray extract"; exit 1; }
  PYPATH=/tmp/raysite
else
  echo "FAILED: no Ray here: build .carry/ray/site.tar.xz with scripts/build_ray_carry.sh and carry .carry/ray"
  exit 1
fi

if [ "$ENGINE" = sglang ]; then
  source bench/carried_site.sh
  sglang_site_ready || step "extracting SGLang into $ZIPKV_SITE"
  extract_sglang_site || { echo "(or run this right after the call that extracted it, within the 30 s warm window)"; exit 1; }
  PYPATH=${PYPATH:+$PYPATH:}$ZIPKV_SITE
  export CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH FLASHINFER_WORKSPACE_BASE=/tmp/fiws \
    FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TVM_FFI_CACHE_DIR=/tmp/tvmffi HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  MODEL=${MODEL:-.carry/llama31_8b}
  [ -f "$MODEL/config.json" ] || { echo "FAILED: $MODEL/config.json missing: carry .carry/llama31_8b"; exit 1; }
  # Dummy weights, no tokenizer; info logs show SGLang's progress in the replica log.
  # The SGLang flags of bench/serving/bench_sglang_e2e.py's milestone 2 (radix cache and chunked prefill off), decode
  # graphs captured up to batch 8 only (4 requests run at most: a shorter start), info logs for progress.
  SGLANG_ARGS=${SGLANG_ARGS:-'{"load_format": "dummy", "log_level": "info", "mem_fraction_static": 0.85, "disable_radix_cache": true, "chunked_prefill_size": -1, "grammar_backend": "none", "cuda_graph_max_bs_decode": 8}'}
else
  MODEL=${MODEL:-}
  SGLANG_ARGS=${SGLANG_ARGS:-}
fi
export PYTHONPATH=${PYPATH}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 GRPC_VERBOSITY=ERROR

if [ -n "$PYPATH" ]; then  # a bare machine: zipkv itself (the `zipkv` module name and its SGLang plugin)
  step "installing zipkv (editable, no deps)"
  timeout 120 python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
fi
step "versions: $(timeout 60 python3 -c 'import ray, grpc, google.protobuf as p; print("ray", ray.__version__, "grpcio", grpc.__version__, "protobuf", p.__version__)')"
[ "$ENGINE" = sglang ] && nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader
# FlashInfer's prefill JIT for the worker, built beside Ray's and the replica's start instead of inside the first
# request (minutes on a fresh machine; bench/serving/warm_prefill.py). Its log: prefill_warm.log.
if [ "$ENGINE" = sglang ] && [ "${ZIPKV_PREFILL_KERNEL:-auto}" != triton ]; then
  python3 -m bench.serving.warm_prefill --model "$MODEL" >"$OUT/prefill_warm.log" 2>&1 &
fi

LEFT=$(( ${DEADLINE_S:-420} - ($(date +%s) - T0) ))
step "starting router + Ray Serve replica (engine $ENGINE${DRILL:+, drill $DRILL}); deadline ${LEFT}s"
# The drill's two requests (prompt + 1900 tokens each, 2048 of context) both run only above 512 MiB: at 512
# one waited at the router on an H100 (2026-12-07), so the drill takes 1024 unless told otherwise.
[ "${DRILL:-}" = replica_faults ] && KV_BUDGET_MIB=${KV_BUDGET_MIB:-1024}
COMMON=(--engine "$ENGINE" --model "$MODEL" --kv-budget-mib "${KV_BUDGET_MIB:-512}" --compression "${COMPRESSION:-true}"
  --sglang-args "$SGLANG_ARGS" --ready-timeout-s "${READY_S:-300}")
if [ "${DRILL:-}" = replica_faults ]; then
  timeout -k 10 "$LEFT" python3 -m bench.serving.replica_faults_gpu "${COMMON[@]}" --faults "${FAULTS:-kill,hang}" \
    --engine-stall-s "${ENGINE_STALL_S:-20}" --out "$OUT/replica_faults.json"
else
  timeout -k 10 "$LEFT" python3 -m bench.serving.ray_serve_gpu "${COMMON[@]}" --out "$OUT/ray_serve_gpu.json"
fi
RC=$?
# The replica's Serve log, and the stdout/stderr of its actor process (SGLang's own log goes there).
for f in /tmp/ray/session_latest/logs/serve/replica_*.log; do [ -f "$f" ] && cp "$f" "$OUT/replica.log"; done
for f in $(grep -l "ServeReplica:zipkv" /tmp/ray/session_latest/logs/worker-*.err /tmp/ray/session_latest/logs/worker-*.out 2>/dev/null); do
  echo "== $f"; tail -n 200 "$f"
done >"$OUT/replica_process.log"
grep -E "Traceback|Error|#running-req|KV Cache is allocated|zipkv pool" "$OUT/replica_process.log" | tail -8
step "done (rc $RC)"
exit $RC
