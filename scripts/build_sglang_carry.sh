#!/bin/bash
# Build the carried SGLang 0.5.17 site-packages for the H200 device machine (run on your own machine,
# from the repo root; needs PyPI, ~520 MB of downloads the first time, ~2 min of xz).
#   bash scripts/build_sglang_carry.sh   -> .carry/sglang/parts/site.tar.xz (~52 MiB)
# Everything third-party stays under .carry/ (git-ignored). Never commit it.
# Device side: mkdir -p /tmp/site && tar -C /tmp/site -xJf .carry/sglang/parts/site.tar.xz (3 s), then PYTHONPATH=/tmp/site.
set -euo pipefail
C=${CARRY_DIR:-.carry/sglang}
DL=$C/dl            # cp312 wheels (--no-deps), 42 files, ~108 MB
K=$C/k045           # sglang-kernel 0.4.5 wheel (383 MB, mostly the 1.1 GB FA3 .so)
SITE=$C/site_build  # pip --target tree, trimmed, then tarred
OUTF=${OUTF:-$C/parts/site.tar.xz}
PY=${PY:-python3}
PLAT="--platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
DLARGS="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp $PLAT"

# What the GPU machine's image lacks for `import sglang` + Engine + Llama + flashinfer/triton
# backends, found by import tracing (a py3.12 venv that
# mimics the image, CUDA faked so GPU-only import branches run). Pins: sglang 0.5.17's METADATA where it pins; otherwise versions whose
# own requirements the image satisfies (fastapi>=0.117 pulls opentelemetry-api, pydantic>=2.12
# wants typing-extensions>=4.14/4.16, ipython>=9.5 wants psutil>=7).
PINS=(
  sglang==0.5.17 flashinfer-python==0.6.15.post1 apache-tvm-ffi==0.1.11 xgrammar==0.2.1
  transformers==5.12.1 tokenizers==0.22.2
  openai==2.6.1 distro==1.9.0 jiter==0.19.0 sniffio==1.3.1
  pydantic==2.11.9 pydantic-core==2.33.2 annotated-types==0.8.0 typing-inspection==0.4.1
  fastapi==0.116.1 starlette==0.47.3 uvicorn==0.35.0
  pyzmq==27.3.0 msgspec==0.23.0 orjson==3.13.0 pybase64==1.5.1 setproctitle==1.3.8
  compressed-tensors==0.20.1 loguru==0.7.3 gguf==0.19.0 dill==0.4.1 partial-json-parser==0.2.1.1.post7
  ipython==9.4.0 ipython-pygments-lexers==1.1.1 jedi==0.20.1 parso==0.8.7 prompt-toolkit==3.0.53
  wcwidth==0.9.4 pexpect==4.9.0 ptyprocess==0.7.0 traitlets==5.16.1 decorator==5.3.1
  matplotlib-inline==0.2.2 stack-data==0.6.3 asttokens==3.0.2 executing==2.3.0 pure-eval==0.2.4
  # SGLang's HTTP server (sglang.launch_server, the serving sweep's baseline) imports these at start-up
  # beyond what the engine needs, and the image lacks them (seen: jsonschema, 2026-12-05): jsonschema from
  # its chat endpoint, soundfile (+ cffi) from its transcription endpoint, python-multipart for FastAPI's
  # form fields on that endpoint.
  jsonschema==4.25.1 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1
  soundfile==0.14.0 cffi==2.0.0 python-multipart==0.0.20
)
mkdir -p "$DL" "$K" "$(dirname "$OUTF")"
$PY -m pip download -q $DLARGS -d "$DL" "${PINS[@]}"
ls "$K"/sglang_kernel-0.4.5-*.whl >/dev/null 2>&1 || $PY -m pip download -q $DLARGS -d "$K" sglang-kernel==0.4.5

rm -rf "$SITE"; mkdir -p "$SITE"
$PY -m pip install -q --no-index --no-deps --no-compile --target "$SITE" $DLARGS "$DL"/*.whl
# sglang-kernel 0.4.5, unpacked without flash_ops (1.1 GB FA3), flashmla_ops, infllm_ops, sm100/
$PY - "$K" "$SITE" <<'EOF'
import glob, sys, zipfile
k, site = sys.argv[1], sys.argv[2]
whl = glob.glob(f"{k}/sglang_kernel-0.4.5-*.whl")[0]
skip = ("sgl_kernel/flash_ops", "sgl_kernel/flashmla_ops", "sgl_kernel/infllm_ops", "sgl_kernel/sm100/")
with zipfile.ZipFile(whl) as z:
    for n in z.namelist():
        if not n.startswith(skip):
            z.extract(n, site)
EOF
chmod +x "$SITE"/sgl_kernel/sm90/*.so "$SITE"/sgl_kernel/*.so
rm -rf "$SITE"/xgrammar/lib "$SITE"/bin   # libxgrammar.a (62 MB static lib) is not used at run time
# jedi (IPython's completer) reads its bundled typeshed and django stubs only when it infers types: 32 MB
# unpacked, and without them the site plus the repository fits one device call's 64 MiB.
rm -rf "$SITE"/jedi/third_party
# SGLang's diffusion generation (`sglang generate`), 12 MB: neither the engine nor sglang.launch_server imports
# it, and without it the HTTP server's packages above still fit one call with the repository.
rm -rf "$SITE"/sglang/multimodal_gen
find "$SITE" -name __pycache__ -prune -exec rm -rf {} +
tar -C "$SITE" -cf - . | xz -9 -T2 > "$OUTF"
ls -l "$OUTF"; du -sh "$SITE"
