# The two set-up commands are `make setup` and `make test`; .ci/run calls exactly them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU build of torch. On machines without a local wheel, point pip at the CPU index:
#   make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_VERSION := 2.13.0
TORCH_INDEX ?=
TORCH_INDEX_FLAG := $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX),)

.PHONY: setup test lint bench-core

setup:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install $(TORCH_INDEX_FLAG) "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -e ".[engine,serve,dev]"

test: lint
	$(BIN)/pytest

lint:
	$(BIN)/ruff check service tests
	$(BIN)/ruff format --check service tests
	$(BIN)/mypy

bench-core:
	$(BIN)/python -m dcoco.bench.core --out docs/bench-core.md
