# dcoco-gateway: the OpenAI gateway only. No torch, no vLLM (the `serve` extra), non-root, and
# nothing written at run time, so it runs with a read-only root filesystem.
# Build from the repository root: docker build -f docker/gateway.Dockerfile -t dcoco-gateway .
# (`make images` builds it with podman.)
FROM python:3.11-slim

# A venv of its own: pip never touches the base image's Python (Debian's refuses that anyway).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/venv/bin:$PATH

WORKDIR /opt/dcoco
COPY pyproject.toml README.md ./
COPY service ./service
# (DL3013: this repository's own package; its dependencies are the ranges in pyproject.toml)
# hadolint ignore=DL3013
RUN python3 -m venv /opt/venv \
    && pip install ".[serve]" \
    && rm -rf service build \
    && useradd --uid 10001 --no-create-home --shell /usr/sbin/nologin dcoco

USER 10001
ENV DCOCO_HOST=0.0.0.0 \
    DCOCO_PORT=8000
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["dcoco", "gateway"]
