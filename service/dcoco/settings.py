"""Configuration from DCOCO_* environment variables (and command-line flags, which win: each
setting of the gateway and the worker is a flag of its command, `commands/args.py`).

Nothing is read at import time: each process builds its settings object once, in main.
"""

import argparse
import json
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from dcoco.paths import DEFAULT_DCOCO, DEFAULT_MODEL_NAME, DEFAULT_TARGET
from dcoco.shared.engine_config import DEFAULT_CACHE_DIR, EngineConfig
from dcoco.shared.errors import UsageError
from dcoco.shared.options import DEFAULT_PRECISION, PRECISION_HELP, Mode, Precision, Rule

S = TypeVar("S", bound=BaseSettings)


def settings_from(cls: type[S], args: argparse.Namespace) -> S:
    """Settings from DCOCO_* variables, overridden by the flags the user gave."""
    overrides = {k: v for k, v in vars(args).items() if k in cls.model_fields and v is not None}
    try:
        return cls(**overrides)
    except ValidationError as problem:
        error = problem.errors()[0]
        raise UsageError(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}") from None


class QueueSettings(BaseSettings):
    """What gateways and workers must agree on."""

    model_config = SettingsConfigDict(env_prefix="DCOCO_", extra="ignore")

    redis_url: str = "redis://127.0.0.1:6379/0"
    queue_timeout_s: float = Field(30.0, gt=0)  # a request not picked up by then is not run
    lease_s: float = Field(10.0, gt=0)  # a worker silent this long is presumed dead
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_prompts: bool = False  # prompt and completion text stay out of logs unless asked


class GatewaySettings(QueueSettings):
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=1, le=65535)
    api_keys: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="comma-separated API keys; empty: no authentication"
    )
    api_keys_file: Path | None = None  # one key per line, e.g. a mounted Kubernetes secret
    rate_limit_rpm: int = Field(0, ge=0)  # requests per minute per API key; 0: unlimited
    rate_limit_burst: int = Field(10, ge=1)  # requests a key may send at once
    max_concurrent_per_key: int = Field(0, ge=0)  # in-flight requests per API key; 0: unlimited
    max_queue_depth: int = Field(256, ge=1)  # waiting requests per model before 429
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    max_n: int = Field(8, ge=1)  # choices per request
    stall_timeout_s: float = Field(60.0, gt=0)  # longest silence from a started request
    retry_after_s: int = Field(1, ge=1)  # Retry-After when the queue is full
    # A stream silent this long gets an SSE comment (": ping"), so that proxies and load
    # balancers, which often cut idle connections after 60 s, keep it open.
    sse_keepalive_s: float = Field(15.0, gt=0)
    # Threads that parse, render and tokenize request bodies off the event loop; more requests
    # wait for a free thread.
    tokenizer_threads: int = Field(4, ge=1)
    # Bodies above this many bytes are parsed and tokenized in the large lane instead: this many
    # threads for the whole gateway and one body at a time per key, so that they queue among
    # themselves, not in front of small requests. 64 KiB is far above a typical chat request.
    large_body_bytes: int = Field(64 * 1024, ge=1024)
    large_body_threads: int = Field(1, ge=1)
    # Slow and idle clients (each closure is counted in dcoco_client_timeouts_total{phase}).
    # An open connection with no request under way (new, or after a response) is closed after
    # keepalive_timeout_s (uvicorn's own keep-alive timeout, 5 s by default there too)...
    keepalive_timeout_s: int = Field(5, ge=1)
    # ...a request whose headers have not all arrived headers_timeout_s after its first byte...
    headers_timeout_s: float = Field(10.0, gt=0)
    # ...and one whose body has not all arrived body_timeout_s after its headers (4 MiB in
    # 30 s is 140 kB/s; a healthy client on any real link sends it far faster).
    body_timeout_s: float = Field(30.0, gt=0)
    # False: /readyz needs Redis only, not a live worker. Set it when workers scale to zero,
    # or the gateway goes unready exactly when requests should wait for a worker to start.
    readyz_requires_workers: bool = True

    @field_validator("api_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return tuple(k.strip() for k in value.split(",") if k.strip())
        return value

    def load_api_keys(self) -> tuple[str, ...]:
        """Keys from DCOCO_API_KEYS plus the keys file; raises ValueError if it is unreadable."""
        keys = list(self.api_keys)
        if self.api_keys_file is not None:
            try:
                lines = self.api_keys_file.read_text().splitlines()
            except OSError as problem:
                raise ValueError(f"cannot read {self.api_keys_file}: {problem}") from None
            keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        return tuple(keys)


class EngineSettings(BaseSettings):
    """How an engine drafts and batches: what `dcoco worker` and `dcoco generate` share."""

    model_config = SettingsConfigDict(env_prefix="DCOCO_", extra="ignore")

    mode: Mode = Field(
        Mode.DCOCO,
        description="what a request that names no speculation gets; a request may "
        "name any mode that needs no more (vanilla < ngram < dflash < dcoco)",
    )
    rule: Rule = Rule.PREFIX
    gamma: float = Field(0.5, gt=0.0, le=1.0)  # the discounted rule's decay per slot
    num_speculative_tokens: int | None = Field(None, ge=1)  # None: the drafter's block size
    top_k: int | None = Field(None, ge=1)  # None: the corrector's K
    max_batch_size: int = Field(32, ge=1)  # concurrent sequences sharing each cycle
    # at most this many prompt tokens a step while streams decode, steered to take about
    # prefill_cycles decoding cycles (0: the cap every step) (engine/prefill.py)
    prefill_tokens: int = Field(256, ge=1)
    prefill_cycles: float = Field(2.0, ge=0.0)
    max_model_len: int | None = Field(None, ge=16)  # None: the target's max_position_embeddings
    # auto: the fastest on this CPU, measured at start (engine/precision.py); fp32: exact.
    precision: Precision = Field(DEFAULT_PRECISION, description=PRECISION_HELP)
    cache_dir: Path = DEFAULT_CACHE_DIR  # auto precision's measured costs, per CPU and model
    # Verify, each cycle, the prefix of the draft that maximises expected tokens per second,
    # from measured acceptance per slot and measured verify cost; False: always all B, for
    # fixed-B comparisons. Lossless either way.
    adaptive: bool = True
    # Adaptive engines: a row may verify its prompt-lookup draft (the tokens that followed its
    # last few tokens earlier in its context) instead of the drafter's, where the planner
    # expects more tokens a second from it (spec/planner.py).
    lookup: bool = True
    # Compile the target's layers on a background thread and run them compiled once ready
    # (engine/compiled.py); not in fp32. False where other work shares the worker's cores.
    compile: bool = True

    def engine_config(self, eos_token_ids: tuple[int, ...]) -> EngineConfig:
        """The one place settings become an engine configuration."""
        return EngineConfig(
            mode=self.mode,
            rule=self.rule,
            gamma=self.gamma,
            num_speculative_tokens=self.num_speculative_tokens,
            top_k=self.top_k,
            max_batch_size=self.max_batch_size,
            prefill_tokens=self.prefill_tokens,
            prefill_cycles=self.prefill_cycles,
            max_model_len=self.max_model_len,
            eos_token_ids=eos_token_ids,
            precision=self.precision,
            cache_dir=self.cache_dir,
            adaptive=self.adaptive,
            lookup=self.lookup,
            compile=self.compile,
        )


class WorkerSettings(QueueSettings, EngineSettings):
    model_name: str = Field(DEFAULT_MODEL_NAME, description="the model name clients ask for")
    # torch: the embedded engine. vllm: AsyncLLM with the DCOCO drafter through our plugin
    # (needs vLLM installed). instant: a test and benchmark fixture that answers with a fixed
    # text and runs no model; never a serving engine.
    engine: Literal["torch", "vllm", "instant"] = Field(
        "torch",
        description="torch: the embedded engine; vllm: AsyncLLM with the DCOCO plugin; "
        "instant: a test and benchmark fixture",
    )
    # Extra vLLM engine arguments, a JSON object of AsyncEngineArgs fields (engine vllm only).
    vllm_args: Annotated[dict[str, Any], NoDecode] = Field(default_factory=dict)
    target: Path = Field(DEFAULT_TARGET, description="target folder (Hugging Face layout)")
    drafter: Path | None = Field(DEFAULT_DCOCO, description="drafter folder (vLLM DFlash layout)")
    metrics_host: str = "127.0.0.1"
    metrics_port: int = Field(9400, ge=0, le=65535, description="0: no metrics endpoint")
    heartbeat_s: float = Field(2.0, gt=0)
    drain_timeout_s: float = Field(25.0, ge=0)  # on SIGTERM, finish in-flight work this long
    worker_id: str | None = None  # default: host name and process id
    # torch engine: threads it computes with; 0: one less than the CPUs it has (torch's count
    # of the CPUs the process may run on, capped by the cgroup's CPU limit and by `cpus`), at
    # least one (worker/threads.py)
    threads: int = Field(0, ge=0)
    # the CPUs the worker's pod is guaranteed (the chart sets its CPU request); 0: not known
    cpus: int = Field(0, ge=0)

    @field_validator("vllm_args", mode="before")
    @classmethod
    def _parse_vllm_args(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                value = json.loads(value) if value.strip() else {}
            except json.JSONDecodeError as bad:
                raise ValueError(f"DCOCO_VLLM_ARGS is not valid JSON ({bad.msg})") from None
        if not isinstance(value, dict):
            raise ValueError("DCOCO_VLLM_ARGS must be a JSON object of vLLM engine arguments")
        return value
