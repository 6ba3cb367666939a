#!/bin/bash
# Serving under SLO on one H200: each system behind its OpenAI endpoint, the Mooncake trace swept over rates by
# SGLang 0.5.17's bench_serving (bench/serving/serving_run.py -> serving_sweep.py). One device call per system, made
# back to back inside the machine's warm window (30 s), because the carried packages do not fit one call:
#   call 1: carry .carry/sglang/parts .carry/llama31_8b   SYSTEMS=sglang_gateway bash bench/run_serving_gpu.sh
#           (extracts SGLang into /tmp/site; SGLang's server directly: one worker, and sglang-router 0.3.2
#           refuses token-id prompts on /v1/completions, bench/serving/serving_systems.py says more)
#   call 2: carry .carry/ray .carry/llama31_8b            SYSTEMS=zipkv bash bench/run_serving_gpu.sh
#   call 3: carry .carry/ray .carry/llama31_8b            SYSTEMS=zipkv_uncompressed bash bench/run_serving_gpu.sh
# .carry/sglang/parts: scripts/build_sglang_carry.sh; .carry/ray: scripts/build_ray_carry.sh;
# .carry/llama31_8b/config.json: a copy of bench/configs/llama31_8b.json. Each call writes $OUT/serving/SYSTEM/
# (rate_R.json per rate, system.json, server logs), packed at the end into $OUT/serving_records.tgz; then,
# here: `python -m bench.serving.serving_goodput --in CALL1/serving_records.tgz --in CALL2/... --device "..."
# --command "..."` writes
# bench/results/serving_goodput.json and .png (and `python -m bench.sim.sim_validation` compares the simulation).
# A second trace window (OFFSET=32 ...: SGLang and Ray stay extracted on the warm machine, so only
# .carry/llama31_8b needs carrying) pools with the first: serving_goodput --pool-windows --in W0 --in W32.
#
# Env: MIXED_CHUNK=1 (SGLang's enable_mixed_chunk, for every system alike), ZIPKV_PREFILL_KERNEL (and
# zipkv's other kernel choices, stack/options.py: they reach the replica and the record), SYSTEMS (comma-separated),
# RATES (req/s, default 0.5,1,2,3), REQUESTS per rate (32, the trace's first 32 from OFFSET 0: mean input
# 13.8k tokens, 9 s of trace; 32 rather than 48 so the three calls take ~23 of a session's 30 device
# minutes, leaving room for a failed machine start, which costs 1-2), KV_BUDGET_MIB (48576 = 388,608 raw
# tokens of Llama-3.1-8B, the e2e bench's budget, for every system), MAX_RUNNING (64), SGLANG_ARGS (JSON, the same for
# every system), DEADLINE_S (560 per call, shared evenly by the call's systems), ENGINE=reference (the tiny
# model on a CPU: the same path, for a dry run of the zipkv systems; unless set, RATES 0.5,1, 12 REQUESTS and
# 600 s per system: the CPU model steps at ~0.4 s, a replica takes up to 3 min to start on a busy 2-core
# machine, and the trace's first 10 share one timestamp, a rate needs two; SGLang's server needs the GPU).
# Expected per call: SGLang up in ~40 s warm (~190 s of JIT cold, the first call), zipkv ~90 s; the sweep
# ~4 min (arrivals span 31 / rate s per rate, plus the drain).
# REPLICAS=2 (two GPUs, bench/run_two_gpu.sh): zipkv's router over two Ray Serve replicas (one GPU each),
# or SYSTEMS=sglang_gateway_cache_aware / sglang_gateway_power_of_two: one SGLang server per GPU behind
# sglang-router 0.3.2 (its wheel carried as .carry/sglang_router/*.whl, installed into /tmp/routersite);
# RATES default to 1,2,4,6,8 (past two workers' knee: the simulation puts zipkv's beyond 6 req/s); the KV
# budget is per replica. GPUS=1 with REPLICAS=2: both replicas (or both SGLang servers) share one GPU, the
# two-replica stack's dry run (bench/run_two_gpu.sh, ONE_GPU=1, sets a KV budget that lets both fit).
set -u
T0=$(date +%s)
OUT=${OUT:?set OUT to a folder for the records and logs}
SYSTEMS=${SYSTEMS:?set SYSTEMS: zipkv, zipkv_uncompressed, zipkv_shed and/or sglang_gateway}
ENGINE=${ENGINE:-sglang}
step() { echo "[run_serving_gpu $(( $(date +%s) - T0 ))s] $*"; }
IFS=',' read -ra LIST <<<"$SYSTEMS"
if [ "$ENGINE" = reference ]; then  # no device call to fit: 600 s per system
  RATES=${RATES:-0.5,1}; REQUESTS=${REQUESTS:-12}; DEADLINE_S=${DEADLINE_S:-$(( 600 * ${#LIST[@]} ))}
fi
REPLICAS=${REPLICAS:-1}
[ "$REPLICAS" -gt 1 ] && RATES=${RATES:-1,2,4,6,8}
RATES=${RATES:-0.5,1,2,3}; REQUESTS=${REQUESTS:-32}; DEADLINE_S=${DEADLINE_S:-560}
PYPATH=""
if [ "$ENGINE" = sglang ]; then
  source bench/carried_site.sh
  sglang_site_ready || step "extracting SGLang into $ZIPKV_SITE"
  extract_sglang_site || exit 1
  if [[ "$SYSTEMS" == *zipkv* ]]; then
    if ! python3 -c "import ray.serve" 2>/dev/null && [ ! -d /tmp/raysite/ray ]; then
      [ -f .carry/ray/site.tar.xz ] || { echo "FAILED: no Ray: carry .carry/ray (scripts/build_ray_carry.sh)"; exit 1; }
      step "extracting Ray into /tmp/raysite"
      mkdir -p /tmp/raysite && timeout 60 tar -C /tmp/raysite -xJf .carry/ray/site.tar.xz
    fi
    [ -d /tmp/raysite/ray ] && PYPATH=/tmp/raysite
  fi
  if [[ "$SYSTEMS" == *sglang_gateway_* ]]; then
    if [ ! -d /tmp/routersite/sglang_router ]; then
      WHEEL=$(ls .carry/sglang_router/sglang_router-0.3.2-*.whl 2>/dev/null | head -1)
      [ -n "$WHEEL" ] || { echo "FAILED: no /tmp/routersite and no .carry/sglang_router/sglang_router-0.3.2-*.whl: carry it"; exit 1; }
      step "installing $WHEEL into /tmp/routersite"
      # --no-deps: its imports (setproctitle, orjson, aiohttp, fastapi, uvicorn) come with SGLang's site
      python3 -m pip install -q --no-deps --target /tmp/routersite "$WHEEL" || { echo "FAILED: pip $WHEEL"; exit 1; }
    fi
    PYPATH=${PYPATH:+$PYPATH:}/tmp/routersite
  fi
  PYPATH=${PYPATH:+$PYPATH:}$ZIPKV_SITE
  export CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH FLASHINFER_WORKSPACE_BASE=/tmp/fiws \
    FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TVM_FFI_CACHE_DIR=/tmp/tvmffi HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
  MODEL=${MODEL:-.carry/llama31_8b}
  [ -f "$MODEL/config.json" ] || { echo "FAILED: $MODEL/config.json missing: carry .carry/llama31_8b"; exit 1; }
  CONTEXT=131072
  # Radix cache on, chunked prefill at SGLang's H200 default (8192), decode CUDA graphs to batch 64; the same
  # for SGLang's server (as flags) and for zipkv's replica (as sglang.Engine arguments).
  SGLANG_ARGS=${SGLANG_ARGS:-'{"load_format": "dummy", "mem_fraction_static": 0.85, "chunked_prefill_size": 8192, "cuda_graph_max_bs_decode": 64, "sampling_backend": "pytorch", "grammar_backend": "none", "disable_radix_cache": false, "disable_prefill_cuda_graph": true, "log_level": "info", "random_seed": 0}'}
  # MIXED_CHUNK=1: SGLang's enable_mixed_chunk for every system (decode steps ride in prefill batches; the
  # first trace run saw decode starve behind prefill, docs/benchmarks.md); the record's command says so.
  if [ "${MIXED_CHUNK:-0}" = 1 ]; then
    SGLANG_ARGS=$(python3 -c 'import json, sys; a = json.loads(sys.argv[1]); a["enable_mixed_chunk"] = True; print(json.dumps(a))' "$SGLANG_ARGS")
  fi
  KV=${KV_BUDGET_MIB:-48576}
  python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/device_gpus.txt"
  # One line: "N x NAME, DRIVER, MEMORY" (two-GPU runs say two)
  echo "$(wc -l <"$OUT/device_gpus.txt") x $(head -1 "$OUT/device_gpus.txt")" >"$OUT/device.txt"
else
  MODEL=${MODEL:-}; CONTEXT=${CONTEXT:-1024}; SGLANG_ARGS=${SGLANG_ARGS:-'{}'}; KV=${KV_BUDGET_MIB:-64}
  # Off the GPU machine: SGLang's wheel source (scripts/setup.sh unzips it) gives bench_serving.
  PYPATH=$(pwd)/.cache/sglang-0.5.17
  echo "$(uname -m) CPU (dry run, ENGINE=reference, $REPLICAS replica(s))" >"$OUT/device.txt"
fi
export PYTHONPATH=${PYPATH}${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 RAY_USAGE_STATS_ENABLED=0 GRPC_VERBOSITY=ERROR
if [ "$ENGINE" = sglang ] && [[ "$SYSTEMS" == *sglang_gateway* ]]; then
  # SGLang's HTTP server imports more than its engine: list whatever the carried site lacks, all at once,
  # and stop in seconds rather than after the server's start-up (bench/serving/import_probe.py).
  step "checking SGLang's server imports"
  python3 -m bench.serving.import_probe sglang.launch_server sglang.srt.entrypoints.http_server \
    || { echo "FAILED: SGLang's server cannot import here: add the missing packages to scripts/build_sglang_carry.sh"; exit 1; }
fi
RC=0
K=0
for SYSTEM in "${LIST[@]}"; do
  # This system's share of what is left: the rest split evenly over it and the systems after it.
  LEFT=$(( (DEADLINE_S - ($(date +%s) - T0)) / (${#LIST[@]} - K) )); K=$((K + 1))
  [ "$LEFT" -gt 60 ] || { step "no time left for $SYSTEM"; RC=1; break; }
  step "$SYSTEM: starting (deadline ${LEFT}s)"
  timeout -k 15 "$LEFT" python3 -m bench.serving.serving_run --system "$SYSTEM" --engine "$ENGINE" --model "$MODEL" \
    --replicas "$REPLICAS" ${GPUS:+--gpus "$GPUS"} \
    --kv-budget-mib "$KV" --max-running "${MAX_RUNNING:-64}" --max-context-tokens "$CONTEXT" \
    --sglang-args "$SGLANG_ARGS" --rates "$RATES" --requests "$REQUESTS" --offset "${OFFSET:-0}" \
    --ready-s "${READY_S:-400}" --deadline-s "$LEFT" --out-dir "$OUT/serving" || RC=$?
  step "$SYSTEM: done (rc $RC)"
done
# Replica logs (zipkv): SGLang's own log lines inside the Ray worker (its decode and prefill lines are what
# step times are read from afterwards: docs/benchmarks.md, "Serving under SLO ... three systems").
for f in $(grep -l "ServeReplica:zipkv" /tmp/ray/session_latest/logs/worker-*.err 2>/dev/null); do tail -n 4000 "$f"; done \
  >"$OUT/serving/replica_process.log" 2>/dev/null
python3 -m bench.serving.serving_goodput --in "$OUT/serving" --device "$(cat "$OUT/device.txt")" \
  --command "$([ "$ENGINE" = reference ] && echo "ENGINE=reference ")$([ "${MIXED_CHUNK:-0}" = 1 ] && echo "MIXED_CHUNK=1 ")$([ -n "${ZIPKV_PREFILL_KERNEL:-}" ] && echo "ZIPKV_PREFILL_KERNEL=$ZIPKV_PREFILL_KERNEL ")REPLICAS=$REPLICAS ${GPUS:+GPUS=$GPUS }${KV_BUDGET_MIB:+KV_BUDGET_MIB=$KV_BUDGET_MIB }SYSTEMS=$SYSTEMS RATES=$RATES REQUESTS=$REQUESTS bash bench/run_serving_gpu.sh" \
  --out "$OUT/serving_goodput.json" | tail -4
if [ "$ENGINE" = sglang ] && [ "${KEEP_SERVING_DIR:-0}" != 1 ]; then
  # The call's records as one file however many the sweep wrote (rate files, server logs, the replica's
  # log): serving_goodput --in reads the archive as it is. KEEP_SERVING_DIR=1 leaves the folder.
  tar -C "$OUT" -czf "$OUT/serving_records.tgz" serving && rm -rf "$OUT/serving" \
    && step "packed $OUT/serving into $OUT/serving_records.tgz"
fi
step "total (rc $RC)"
exit $RC
