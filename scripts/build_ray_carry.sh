#!/bin/bash
# Build the carried Ray (+ the router's and worker's Python needs) for the H200 device machine, whose image
# has no Ray. Run on your own machine from the repo root (needs PyPI; ~90 MB of downloads the first time):
#   bash scripts/build_ray_carry.sh        -> .carry/ray/site.tar.xz (~25 MiB; the size is printed last)
# Device side (bench/run_ray_serve_gpu.sh does it): tar -C /tmp/raysite -xJf .carry/ray/site.tar.xz, then
# PYTHONPATH=/tmp/raysite:/tmp/site (the carried SGLang site second).
#
# What goes in: what neither the device image (see the device notes' package list) nor the SGLang site
# (fastapi 0.116, starlette 0.47, uvicorn 0.35, pydantic 2.11, openai 2.6, tokenizers 0.22) holds:
#   ray 2.60.0 (cp312), trimmed: no Java jars, no RL/Tune/Train/Data/LLM libraries, no dashboard web client,
#     no tests, binaries stripped of symbols. Ray runs in its "minimal" mode there (no aiohttp_cors /
#     opencensus, so no dashboard server), which is all `ray.init` + Ray Serve with its proxy off need.
#   jsonschema + referencing + jsonschema-specifications + rpds-py (Ray's own requirement).
#   grpcio 1.85.3 (+ grpcio-reflection, which ray.serve imports) and protobuf 7.36.2: protos/zipkv_pb2*.py are generated for grpcio >= 1.85.1 and protobuf
#     7.35.1; the image's versions are older or unknown, so ours win on PYTHONPATH.
#   redis (the router imports it only for the redis state backend; tiny) and opentelemetry api/sdk.
# Idempotent: downloads are kept in .carry/ray_build/dl; the site is rebuilt and re-tarred each run.
set -euo pipefail
# Downloads and the unpacked tree live beside the carried folder, so that `.carry/ray` holds the tarball alone
# and can be named in `carry` as it is.
B=${BUILD_DIR:-.carry/ray_build}
DL=$B/dl
SITE=$B/site_build
OUTF=${OUTF:-.carry/ray/site.tar.xz}
PY=${PY:-python3}
PLAT="--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
DLARGS="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT"
PINS=(
  ray==2.60.0
  jsonschema==4.26.0 referencing==0.37.0 jsonschema-specifications==2025.9.1 rpds-py==2026.9.1
  grpcio==1.85.3 grpcio-reflection==1.85.1 protobuf==7.36.2 redis==8.1.0
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-semantic-conventions==0.66b2
)
mkdir -p "$DL" "$(dirname "$OUTF")"
echo "downloading ${#PINS[@]} wheels for cp312 into $DL (skips those present)"
$PY -m pip download -q $DLARGS -d "$DL" "${PINS[@]}"

rm -rf "$SITE"; mkdir -p "$SITE"
echo "installing into $SITE"
$PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $DLARGS "$DL"/*.whl
R=$SITE/ray
# Libraries zipkv does not use, Java, the dashboard's web client, console scripts (wrong interpreter path).
rm -rf "$R"/jars "$R"/rllib "$R"/tune "$R"/train "$R"/llm "$R"/data "$R"/workflow "$R"/dashboard/client \
  "$SITE"/bin
find "$SITE" \( -name tests -o -name __pycache__ \) -type d -prune -exec rm -rf {} +
# Debug symbols are a third of each binary; nothing reads them at run time.
strip --strip-unneeded "$R"/_raylet.so "$R"/core/src/ray/raylet/raylet "$R"/core/src/ray/gcs/gcs_server
find "$SITE" -name '*.so*' -type f ! -path "$R/_raylet.so" -exec strip --strip-unneeded {} + 2>/dev/null || true
echo "site: $(du -sh "$SITE" | cut -f1); compressing (xz -9, ~1-2 min)"
tar -C "$SITE" -cf - . | xz -9 -T2 >"$OUTF.tmp"
mv "$OUTF.tmp" "$OUTF"
ls -l "$OUTF"
echo "size: $(( $(stat -c %s "$OUTF") / 1048576 )) MiB ($OUTF)"
