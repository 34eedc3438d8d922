"""The engine a worker drives, chosen by DCOCO_ENGINE. Each engine's heavy imports (torch, vLLM)
happen only when it is chosen."""

import logging
import threading

from dcoco.settings import WorkerSettings
from dcoco.shared.errors import UsageError
from dcoco.shared.protocol import EngineClient
from dcoco.tokenizer import Tokenizer
from dcoco.worker.metrics import WorkerMetrics
from dcoco.worker.threads import cgroup_cpus, engine_threads

log = logging.getLogger(__name__)

INSTANT_ANSWER = " the quick brown fox jumps over the lazy dog"


def build_engine_client(settings: WorkerSettings, tokenizer: Tokenizer) -> EngineClient:
    """Must run inside the worker's event loop (engine clients hand results to it)."""
    if settings.engine == "instant":
        from dcoco.shared.instant import InstantEngineClient

        ids = tokenizer.encode(INSTANT_ANSWER)
        return InstantEngineClient(settings.max_model_len or 2048, settings.max_batch_size, ids)
    if settings.engine == "vllm":
        try:
            from dcoco.vllm.client import VllmEngineClient
        except ModuleNotFoundError as missing:
            if missing.name != "vllm":
                raise
            raise UsageError(
                "engine vllm needs vLLM in this Python environment (`make setup` installs it "
                "in .venv-vllm: run .venv-vllm/bin/dcoco worker)"
            ) from None

        return VllmEngineClient(settings, tokenizer.eos_token_ids)
    import torch

    from dcoco.engine.client import TorchEngineClient
    from dcoco.engine.load import load_engine

    limit = cgroup_cpus()
    threads = engine_threads(settings.threads, torch.get_num_threads(), limit, settings.cpus)
    torch.set_num_threads(threads)  # before loading: `auto` measures with these threads
    log.info(
        "engine threads %d (asked: %s, cgroup CPU limit: %s, guaranteed CPUs: %s)",
        threads,
        settings.threads or "auto",
        limit or "none",
        settings.cpus or "unknown",
    )
    cfg = settings.engine_config(tokenizer.eos_token_ids)
    return TorchEngineClient(load_engine(settings.target, settings.drafter, cfg))


def compiling(settings: WorkerSettings, engine: EngineClient) -> list[threading.Event]:
    """The torch engine's layer compiles under way, each as the event set when it ends."""
    if settings.engine != "torch":
        return []
    runner = engine.engine.runner  # type: ignore[attr-defined]
    parts = (runner.compiled, runner.compiled_drafter)
    return [layers.done for layers in parts if layers is not None]


def adopt_engine_metrics(
    settings: WorkerSettings, engine: EngineClient, metrics: WorkerMetrics
) -> None:
    """Series an engine measures in processes of its own (vLLM's plugin, in vLLM's worker)
    replace the worker's own exporters of them; the torch engine's precision is exported."""
    if settings.engine == "torch":
        torch_engine = engine.engine  # type: ignore[attr-defined]
        costs = torch_engine.costs
        precision = torch_engine.cfg.precision.value
        metrics.record_precision(precision, costs.seconds if costs is not None else {})
        runner = torch_engine.runner
        parts = {"target": runner.compiled, "drafter": runner.compiled_drafter}
        compiling = {part: layers for part, layers in parts.items() if layers is not None}
        if compiling:
            metrics.record_compiled(compiling, runner.stalls)
        log.info("engine precision %s (asked: %s)", precision, settings.precision.value)
    if settings.engine == "vllm":
        from dcoco.vllm.metrics import PLUGIN_SERIES

        metrics.defer_to(engine.collector, PLUGIN_SERIES)  # type: ignore[attr-defined]
