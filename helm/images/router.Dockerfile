# The zipkv router: the OpenAI-compatible HTTP API and the ControlPlane report server. No torch, no GPU.
#
#   docker build -f helm/images/router.Dockerfile -t zipkv-router:0.1.0 .      # from the repository root
#
# The chart runs it as uid 10001 with a read-only root filesystem: nothing here writes outside /tmp.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
# setuptools maps every zipkv package from its folder, so all of them must exist to build the wheel; only
# zipkv.controlplane and zipkv.protos are ever imported here (the others need torch, which is absent).
COPY controlplane/ controlplane/
COPY protos/ protos/
COPY worker/ worker/
COPY kernels/ kernels/
COPY allocator/ allocator/
COPY stack/ stack/
COPY testing/ testing/
# The router's dependencies are the `controlplane` extra (read from pyproject.toml, so they never drift)
# plus what it imports directly beyond the extra: its tokenizer for real models (tokenizer.json and the
# chat template), anyio (also a dependency of fastapi and httpx) and uvloop (the faster event loop the
# router uses when present).
RUN python -c "import tomllib; x = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']; print('\n'.join(x['controlplane']))" > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt "tokenizers>=0.20" "jinja2>=3.1" "anyio>=4.0" "uvloop>=0.19" \
 && pip install --no-deps . \
 && python -c "import zipkv.controlplane.app, zipkv.controlplane.config" \
 && if python -c "import torch" 2>/dev/null; then echo "torch must not be in the router image" >&2; exit 1; fi

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 zipkv && useradd --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin zipkv
COPY --from=build /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /tmp
EXPOSE 8000 50051
ENTRYPOINT ["python", "-m", "zipkv.controlplane"]
CMD ["--config", "/etc/zipkv/router.yaml"]
