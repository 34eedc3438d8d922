# dcoco-worker-vllm: vLLM's CUDA image plus this package, whose `vllm.general_plugins` entry
# point adds the DCOCO drafter to vLLM. Build from the repository root:
#   docker build -f docker/worker-vllm.Dockerfile -t dcoco-worker-vllm .
# Default command: our worker (`dcoco worker --engine vllm`) behind the gateway and Redis.
# Alternative, plain vLLM with the plugin:
#   docker run --gpus all --entrypoint vllm dcoco-worker-vllm serve /models/target \
#     --speculative-config '{"method": "dflash", "model": "/models/dcoco", "num_speculative_tokens": 15}'
ARG VLLM_IMAGE_TAG=v0.32.0
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
COPY models/default /opt/dcoco/models/default

USER 10001
ENV DCOCO_ENGINE=vllm \
    DCOCO_TARGET=/opt/dcoco/models/default/target \
    DCOCO_DRAFTER=/opt/dcoco/models/default/dcoco \
    DCOCO_METRICS_HOST=0.0.0.0 \
    DCOCO_METRICS_PORT=9400
EXPOSE 9400
HEALTHCHECK --interval=10s --timeout=3s --start-period=300s --retries=3 \
    CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:9400/healthz', timeout=2)"]
ENTRYPOINT []
CMD ["dcoco", "worker", "--engine", "vllm"]
