#!/bin/bash
# SGLang end to end on the H200, one device call. Needs, git-ignored under .carry/: sglang/parts/site.tar.xz (a
# Python 3.12 site-packages tree of SGLang 0.5.17 and its GPU dependencies, scripts/build_sglang_carry.sh) and
# llama31_8b/config.json (a copy of bench/configs/llama31_8b.json, scripts/build_kernel_carry.sh).
# Writes $OUT/sglang_e2e.json and $OUT/logs/.
#
# Offline call (default): offline_8192x256 for zipkv, zipkv_uncompressed, triton, flashinfer (FlashInfer last:
# its JIT is slow; it gets whatever time is left), each in its own process under `timeout`.
#     bash bench/run_sglang_e2e_gpu.sh
# Online call (ONLINE=1): online_1024x8192 for zipkv, flashinfer, then zipkv_uncompressed if time is left,
# merged into the offline results: copy the offline call's sglang_e2e.json to bench/results/ first.
#     ONLINE=1 bash bench/run_sglang_e2e_gpu.sh
# Tensor parallel call (TP2=1, two GPUs: nvidia-h200-x2, bench/run_two_gpu.sh): medium_1024x2048 at tp_size=2
# for zipkv, zipkv_uncompressed (greedy identity), flashinfer (the ratio), merged like ONLINE=1.
#     TP2=1 bash bench/run_sglang_e2e_gpu.sh
# On a fresh (cold) machine the JIT compiles make the offline runs too long for one call: two calls,
#     RUNS=zipkv:m2:offline:330,zipkv_uncompressed:m2:offline:230 bash bench/run_sglang_e2e_gpu.sh
#     MERGE_WITH=<the first call's sglang_e2e.json> RUNS=flashinfer:m2:offline:400 bash bench/run_sglang_e2e_gpu.sh
# PROFILE_STEPS=N: after each timed run, a second pass of its requests with N decode steps at the largest batch
# profiled by SGLang's profiler (bench/serving/step_profile.py): the row's step_profile, ms per step per kernel.
# RUNS=... overrides the runs (SYSTEM:MILESTONE[:offline|online|small[:TIMEOUT_S]], comma-separated).
# Expected (2026-11-30 timings): setup 20 s cold, 5 s warm; offline zipkv 120-150 s (cold Triton JIT), the
# uncompressed twin and Triton 60-80 s, FlashInfer 110-190 s; online ~110-150 s per system on a warm machine.
set -u
T0=$(date +%s)
# A second call on the same warm machine finds the site already there.
source bench/carried_site.sh
extract_sglang_site || exit 1
export PYTHONPATH=$ZIPKV_SITE CUDA_HOME=/usr/local/cuda PATH=/usr/local/cuda/bin:$PATH \
  FLASHINFER_WORKSPACE_BASE=/tmp/fiws FLASHINFER_CUDA_ARCH_LIST=9.0a MAX_JOBS=16 TVM_FFI_CACHE_DIR=/tmp/tvmffi \
  HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/pip.log" 2>&1 || tail -5 "$OUT/pip.log"
python3 -c "import importlib.metadata as m; print('sglang', m.version('sglang'), [e.value for e in m.entry_points(group='sglang.srt.plugins')])"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
MERGE=()
if [ "${TP2:-0}" = 1 ]; then
  [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "FAILED: TP2=1 needs two GPUs"; nvidia-smi -L; exit 1; }
  DEFAULT_RUNS="zipkv:tp2:medium:180,zipkv_uncompressed:tp2:medium:150,flashinfer:tp2:medium:220"
  if [ -f bench/results/sglang_e2e.json ]; then cp bench/results/sglang_e2e.json "$OUT/sglang_e2e.json"; fi
  MERGE=(--merge)
elif [ "${ONLINE:-0}" = 1 ]; then
  DEFAULT_RUNS="zipkv:m2:online:200,flashinfer:m2:online:240,zipkv_uncompressed:m2:online"
  if [ -f bench/results/sglang_e2e.json ]; then cp bench/results/sglang_e2e.json "$OUT/sglang_e2e.json"; fi
  MERGE=(--merge)
else
  DEFAULT_RUNS="zipkv:m2:offline:200,zipkv_uncompressed:m2:offline:130,triton:m2:offline:130,flashinfer:m2:offline"
fi
RUNS=${RUNS:-$DEFAULT_RUNS}
# FlashInfer's prefill JIT for the zipkv worker, built beside the servers' start instead of inside the first
# zipkv run's first extend (minutes on a fresh machine; bench/serving/warm_prefill.py). Its log: prefill_warm.log.
case ",$RUNS" in
  *,zipkv*) if [ "${ZIPKV_PREFILL_KERNEL:-auto}" != triton ]; then
      python3 -m bench.serving.warm_prefill --model .carry/llama31_8b >"$OUT/prefill_warm.log" 2>&1 &
    fi ;;
esac
# MERGE_WITH=FILE: add this call's runs to an earlier call's record (e.g. FlashInfer after zipkv, when the
# three offline runs of a cold machine do not fit one call).
if [ -n "${MERGE_WITH:-}" ]; then cp "$MERGE_WITH" "$OUT/sglang_e2e.json" && MERGE=(--merge); fi
LEFT=$(( ${DEADLINE_S:-560} - ($(date +%s) - T0) ))
python3 -m bench.serving.bench_sglang_e2e --model .carry/llama31_8b --deadline-s "$LEFT" --timeout-s 240 --runs "$RUNS" \
  --profile-steps "${PROFILE_STEPS:-0}" \
  "${MERGE[@]}" --out "$OUT/sglang_e2e.json" --logs "$OUT/logs" \
  --command "$(env | grep -E '^ZIPKV_[A-Z_]+=' | sort | tr '\n' ' ')ONLINE=${ONLINE:-0} TP2=${TP2:-0} PROFILE_STEPS=${PROFILE_STEPS:-0} RUNS=$RUNS bash bench/run_sglang_e2e_gpu.sh"
echo "total $(( $(date +%s) - T0 )) s"
