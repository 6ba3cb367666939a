#!/bin/bash
# Two GPUs (device kind nvidia-h200-x2): the serving sweep with two workers, zipkv's router against SGLang's
# gateway, and SGLang at tensor parallelism 2, zipkv against FlashInfer. One device call per STEP, made back
# to back inside the machine's warm window (30 s between calls), because no two carries fit one call's
# 64 MiB (SGLang's site 52 MiB, the gateway's wheel 31 MiB, Ray 22 MiB); each call finds what the calls
# before it extracted under /tmp (SGLang in /tmp/site, the gateway in /tmp/routersite, Ray in /tmp/raysite).
#
#   call  STEP           carry                                   runs                              expected
#   1     tp2            .carry/sglang/parts .carry/llama31_8b   TP2=1 bash bench/run_sglang_e2e_gpu.sh   ~6 min
#   2     zipkv          .carry/ray .carry/llama31_8b            REPLICAS=2 SYSTEMS=zipkv ...             ~8 min
#   3     cache_aware    .carry/sglang_router .carry/llama31_8b  REPLICAS=2 SYSTEMS=sglang_gateway_cache_aware ...
#   4     power_of_two   .carry/llama31_8b                       REPLICAS=2 SYSTEMS=sglang_gateway_power_of_two ...
#   5     tp2_offline    .carry/llama31_8b (after call 1)        TP2=1 RUNS=zipkv:tp2:offline,flashinfer:tp2:offline ...
# (3 and 4: ~7 min each; the serving steps are bench/run_serving_gpu.sh with the arguments shown.) Call 5, when
# device time is left: the offline 64 x 8192 -> 256 workload at TP=2, where admission binds (one GPU: zipkv
# runs 59 requests where SGLang runs 45), so it shows whether the ranks' agreed headroom lends compression's
# bytes at TP=2 (the running batch against FlashInfer's) and what the agreement costs (the pool lines); copy
# call 1's sglang_e2e.json to bench/results/ here first, so that call 5 (which copies the tree) merges onto it.
# Call 1 extracts SGLang, which every later call needs; if the machine went cold between calls, carry
# .carry/sglang/parts again in place of the step's other carry where they do not fit together (zipkv's
# call: Ray + SGLang = 74 MiB: then run call 1 again first). Steps 1-4 take ~28 min of the 30-minute device
# budget: if less is left, drop power_of_two (the simulation predicts it ahead of cache_aware only past
# 4 req/s) before the others.
#
# Carries, built here (git-ignored): .carry/sglang/parts/site.tar.xz and .carry/ray/site.tar.xz as for the
# one-GPU runs (bench/run_serving_gpu.sh); .carry/sglang_router/sglang_router-0.3.2-*.whl by
#   python -m pip download sglang-router==0.3.2 --no-deps -d .carry/sglang_router
# (its imports, setproctitle, orjson, aiohttp, fastapi and uvicorn, come with SGLang's site; on a CPU,
# tests/bench/test_gateway_probe.py checks its request path with ZIPKV_SGLANG_ROUTER_SITE set);
# .carry/llama31_8b/config.json: a copy of bench/configs/llama31_8b.json.
#
# Each call writes $OUT (the device call's folder); afterwards, here, with the calls' folders fetched:
#   python -m bench.serving.serving_goodput --in CALL2/serving_records.tgz --in CALL3/serving_records.tgz \
#       --in CALL4/serving_records.tgz \
#       --device "2 x NVIDIA H200" --command "STEP=... bash bench/run_two_gpu.sh" \
#       --out bench/results/serving_goodput_two_gpu.json
#   python -m bench.sim.serving_predicted --workers 2 --measured bench/results/serving_goodput_two_gpu.json \
#       --out bench/results/serving_predicted_two_gpu.json
#   cp CALL1/sglang_e2e.json bench/results/sglang_e2e.json   (call 1 merged its tp2 rows into a copy of it)
# A dry run of the zipkv step on a CPU (two tiny reference replicas, the same harness):
#   ENGINE=reference REPLICAS=2 SYSTEMS=zipkv OUT=/tmp/two bash bench/run_serving_gpu.sh
# ONE_GPU=1: the serving steps' dry run on a one-GPU machine, the same calls and carries: both replicas
# (zipkv: Ray packs two half-GPU replicas onto the device; the gateway: two SGLang servers on device 0)
# share the GPU, each engine with KV_BUDGET_MIB (default 16400, 131,200 raw tokens: the least that holds one
# request at the 131,072-token context zipkv's worker checks for; two 8B-shaped engines, 15 GiB of weights
# each, then fit an 80 GB card), RATES 0.5,1,2 and 32 requests. It checks the two-replica path
# (placement over two live workers, the gateway's policies, the records) end to end; its goodput is two
# engines splitting one GPU, not two GPUs' (docs/benchmarks.md, "Two GPUs"). tp2 needs two devices.
set -u
OUT=${OUT:?set OUT to a folder for the records and logs}
STEP=${STEP:?set STEP: tp2, zipkv, cache_aware, power_of_two or tp2_offline}
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "${ONE_GPU:-0}" = 1 ]; then
  [ "$GPUS" -ge 1 ] || { echo "FAILED: ONE_GPU=1 needs a GPU"; exit 1; }
  case "$STEP" in tp2*) echo "FAILED: $STEP needs two devices (ONE_GPU=1 runs the serving steps only)"; exit 2 ;; esac
  export GPUS=1 KV_BUDGET_MIB=${KV_BUDGET_MIB:-16400} RATES=${RATES:-0.5,1,2} REQUESTS=${REQUESTS:-32}
else
  [ "$GPUS" -ge 2 ] || { echo "FAILED: $STEP needs two GPUs, this machine has $GPUS (ONE_GPU=1: the dry run)"; nvidia-smi -L; exit 1; }
  unset GPUS  # one per replica
fi
case "$STEP" in
  tp2) TP2=1 bash bench/run_sglang_e2e_gpu.sh ;;
  tp2_offline) TP2=1 RUNS=zipkv:tp2:offline:260,flashinfer:tp2:offline:280 bash bench/run_sglang_e2e_gpu.sh ;;
  zipkv) REPLICAS=2 SYSTEMS=zipkv bash bench/run_serving_gpu.sh ;;
  cache_aware) REPLICAS=2 SYSTEMS=sglang_gateway_cache_aware bash bench/run_serving_gpu.sh ;;
  power_of_two) REPLICAS=2 SYSTEMS=sglang_gateway_power_of_two bash bench/run_serving_gpu.sh ;;
  *) echo "FAILED: unknown STEP $STEP (tp2, zipkv, cache_aware, power_of_two, tp2_offline)"; exit 2 ;;
esac
