# The zipkv worker: Ray Serve replicas running the SGLang engine with zipkv's compressed KV cache.
# KubeRay runs the Ray head and workers from this image (it needs `ray`, bash and wget on PATH).
#
#   docker build -f helm/images/worker.Dockerfile -t zipkv-worker:0.1.0 .      # from the repository root
#
# A CUDA *devel* base: FlashInfer and SGLang compile kernels with nvcc on first use, and Triton builds
# its launchers with the C compiler at run time. The versions are the ones zipkv pins and tests:
# SGLang 0.5.17 with its torch 2.11 (CUDA 13.0 wheels).
ARG CUDA_IMAGE=nvidia/cuda:13.0.1-cudnn-devel-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH_VERSION=2.11.0
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cu130
ARG SGLANG_VERSION=0.5.17

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential ninja-build \
      bash wget curl ca-certificates numactl libnuma1 \
 && rm -rf /var/lib/apt/lists/*

# uid 1000 is the "ray" user the chart runs as (the Ubuntu image ships an "ubuntu" user with that uid).
RUN (userdel --remove ubuntu 2>/dev/null || true) \
 && groupadd --gid 1000 ray && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash ray

RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX_URL}"

WORKDIR /src
COPY pyproject.toml README.md ./
COPY controlplane/ controlplane/
COPY protos/ protos/
COPY worker/ worker/
COPY kernels/ kernels/
COPY allocator/ allocator/
COPY stack/ stack/
COPY testing/ testing/
# The `sglang` extra: SGLang pinned, Ray Serve, and zipkv's worker dependencies. torch stays the CUDA
# build installed above (the extra index keeps pip from swapping it for another variant).
RUN pip install --extra-index-url "${TORCH_INDEX_URL}" "sglang==${SGLANG_VERSION}" ".[sglang]" \
 && python -c "import importlib.metadata as m; assert m.version('sglang') == '${SGLANG_VERSION}', m.version('sglang')" \
 && python -c "import zipkv.worker.serve, zipkv.kernels.format.layout, ray.serve" \
 && ray --version

# Kernel caches go to writable, per-pod scratch space.
ENV HOME=/home/ray \
    PYTHONUNBUFFERED=1 \
    FLASHINFER_WORKSPACE_BASE=/tmp/flashinfer \
    TVM_FFI_CACHE_DIR=/tmp/tvm-ffi \
    TRITON_CACHE_DIR=/tmp/triton \
    HF_HOME=/tmp/hf
USER 1000:1000
WORKDIR /home/ray
