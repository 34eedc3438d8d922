"""`dcoco worker`: load the engine, publish the model card, consume the queue until SIGTERM."""

import asyncio
import hashlib
import json
import logging
import os
import signal
import socket
import threading
import time
from typing import cast

from prometheus_client import CollectorRegistry

from dcoco.queue.connection import UNAVAILABLE, back_off, connect
from dcoco.queue.consumer import WorkerQueue
from dcoco.queue.protocol import ModelCard, Speculation
from dcoco.settings import WorkerSettings
from dcoco.shared.heap import FullCollections, freeze_startup_heap
from dcoco.shared.options import Mode
from dcoco.shared.supervisor import LoopFailed
from dcoco.tokenizer import Tokenizer
from dcoco.worker.engines import adopt_engine_metrics, build_engine_client, compiling
from dcoco.worker.http import Health, serve_http
from dcoco.worker.metrics import WorkerMetrics
from dcoco.worker.worker import Worker

log = logging.getLogger(__name__)
COMPILE_POLL_S = 1.0


async def run_worker(settings: WorkerSettings) -> int:
    """Returns the exit status: 0 after a clean drain, 1 if the engine failed or a loop kept
    crashing."""
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, settings.model_name)
    metrics.max_batch_size.labels(settings.model_name).set(settings.max_batch_size)
    FullCollections(metrics.gc_full_collections.observe)
    health = Health(stale_after_s=settings.lease_s)
    server = (
        serve_http(settings.metrics_host, settings.metrics_port, registry, health)
        if settings.metrics_port
        else None
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    tokenizer = Tokenizer.from_dir(settings.target)
    tokenizer_json = (settings.target / "tokenizer.json").read_text()
    engine = build_engine_client(settings, tokenizer)
    adopt_engine_metrics(settings, engine, metrics)
    health.engine_failed = lambda: engine.failure is not None
    card = model_card(settings, tokenizer, tokenizer_json, engine.max_model_len)
    worker_id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    redis = connect(settings.redis_url, timeout_s=2.0)
    blocking = connect(settings.redis_url, timeout_s=3.0)  # XREADGROUP blocks up to 1 s
    queue = WorkerQueue(redis, blocking, settings.model_name, worker_id, settings.lease_s)
    worker = Worker(settings, engine, tokenizer, queue, metrics, card, tokenizer_json, health)
    freeze_startup_heap()
    refreeze = asyncio.create_task(freeze_when_compiled(compiling(settings, engine)))
    status = 0
    try:
        failures = 0
        while not stop.is_set():
            try:
                await worker.run(stop)
                break
            except UNAVAILABLE as problem:
                failures += 1
                await back_off("start", problem, failures)
    except LoopFailed:
        status = 1
    finally:
        refreeze.cancel()
        await engine.close()
        await redis.aclose()
        await blocking.aclose()
        if server is not None:
            server.shutdown()
    return 1 if engine.failure else status


async def freeze_when_compiled(compiles: list[threading.Event]) -> None:
    """Freezes the heap again once the background compiles end: inductor leaves about 130,000
    objects of its own for good (graphs, guards, generated code), and full collections over
    them took 45-105 ms (the tiny pair, one AMD EPYC core)."""
    if not compiles:
        return
    while not all(done.is_set() for done in compiles):
        await asyncio.sleep(COMPILE_POLL_S)
    freeze_startup_heap(collect=False)  # streams may be running


def model_card(
    settings: WorkerSettings, tokenizer: Tokenizer, tokenizer_json: str, max_model_len: int
) -> ModelCard:
    return ModelCard(
        name=settings.model_name,
        max_model_len=max_model_len,
        tokenizer_sha=hashlib.sha256(tokenizer_json.encode()).hexdigest()[:16],
        chat_template=tokenizer.chat_template,
        created=int(time.time()),
        engine=settings.engine,
        default_speculation=cast(Speculation, settings.mode.speculation),
        speculation=runnable_speculation(settings),
        provenance=settings.engine != "vllm",
    )


def runnable_speculation(settings: WorkerSettings) -> tuple[Speculation, ...]:
    """What a request may ask of this worker: the torch engine runs its mode and every mode
    that needs less, per request (`Mode.runnable`: a DCOCO engine all four); vLLM drafts one
    way for every request; the instant fixture runs no model and takes any."""
    if settings.engine == "vllm":
        modes: tuple[Mode, ...] = (settings.mode,)
    elif settings.engine == "instant":
        modes = tuple(Mode)
    else:
        modes = settings.mode.runnable()
    return tuple(cast(Speculation, m.speculation) for m in modes)


async def register_model(settings: WorkerSettings) -> None:
    """Publishes the model card and tokenizer from the target folder, loading no engine, and
    creates the request stream's consumer group. Before any worker of a model that scales from
    zero has run, this is what lets the gateway accept (and queue) its requests. The context
    is DCOCO_MAX_MODEL_LEN or the target's max_position_embeddings; the first worker that
    starts publishes the engine's own."""
    tokenizer = Tokenizer.from_dir(settings.target)
    tokenizer_json = (settings.target / "tokenizer.json").read_text()
    config = json.loads((settings.target / "config.json").read_text())
    limit = settings.max_model_len or int(config.get("max_position_embeddings", 4096))
    card = model_card(settings, tokenizer, tokenizer_json, limit)
    redis = connect(settings.redis_url, timeout_s=2.0)
    try:
        queue = WorkerQueue(redis, redis, settings.model_name, "register", settings.lease_s)
        await queue.register(card, tokenizer_json)
    finally:
        await redis.aclose()
    log.info("model registered", extra={"model": card.name, "max_model_len": limit})
