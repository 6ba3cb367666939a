# Sourced on the GPU machine, from the repo root, by bench/gpu_env.sh, bench/run_sglang_e2e_gpu.sh,
# bench/run_serving_gpu.sh and bench/run_ray_serve_gpu.sh: the carried SGLang site
# (.carry/sglang/parts/site.tar.xz, scripts/build_sglang_carry.sh: SGLang 0.5.17 and its GPU dependencies,
# FlashInfer among them) extracted into $ZIPKV_SITE (default /tmp/site) once a machine; a later call on the
# same warm machine finds it there.
ZIPKV_SITE=${ZIPKV_SITE:-/tmp/site}
sglang_site_ready() { [ -f "$ZIPKV_SITE/.zipkv_extracted" ]; }
extract_sglang_site() {
  sglang_site_ready && return 0
  if [ ! -f .carry/sglang/parts/site.tar.xz ]; then
    echo "FAILED: $ZIPKV_SITE holds no SGLang site and .carry/sglang/parts/site.tar.xz was not carried:" \
         "build it (scripts/build_sglang_carry.sh) and carry .carry/sglang/parts"
    return 1
  fi
  mkdir -p "$ZIPKV_SITE" && tar -C "$ZIPKV_SITE" -xJf .carry/sglang/parts/site.tar.xz && touch "$ZIPKV_SITE/.zipkv_extracted"
}
