# Sourced by bench/gpu_env.sh and bench/run_sglang_e2e_gpu.sh on the GPU machine, from the repo root: the
# carried SGLang site (.carry/sglang/parts/site.tar.xz, scripts/build_sglang_carry.sh: SGLang 0.5.17 and its
# GPU dependencies, FlashInfer among them) extracted into $SITE (default /tmp/site) once a machine; a later
# call on the same warm machine finds it there.
SITE=${SITE:-/tmp/site}
extract_sglang_site() {
  [ -f "$SITE/.zipkv_extracted" ] && return 0
  if [ ! -f .carry/sglang/parts/site.tar.xz ]; then
    echo "FAILED: $SITE holds no SGLang site and .carry/sglang/parts/site.tar.xz was not carried:" \
         "build it (scripts/build_sglang_carry.sh) and carry .carry/sglang/parts"
    return 1
  fi
  mkdir -p "$SITE" && tar -C "$SITE" -xJf .carry/sglang/parts/site.tar.xz && touch "$SITE/.zipkv_extracted"
}
