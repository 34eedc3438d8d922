"""`dcoco worker`: load the engine, publish the model card, consume the queue until SIGTERM."""

import asyncio
import hashlib
import logging
import os
import signal
import socket
import time

from prometheus_client import CollectorRegistry, start_http_server

from dcoco.engine.config import EngineConfig, Mode
from dcoco.queue.connection import UNAVAILABLE, connect
from dcoco.queue.consumer import WorkerQueue
from dcoco.queue.protocol import ModelCard
from dcoco.settings import WorkerSettings
from dcoco.spec.select import Rule
from dcoco.tokenizer import Tokenizer
from dcoco.worker.engine_client import EngineClient, TorchEngineClient
from dcoco.worker.metrics import WorkerMetrics
from dcoco.worker.worker import Worker

log = logging.getLogger(__name__)
INSTANT_ANSWER = " the quick brown fox jumps over the lazy dog"


def build_engine_client(settings: WorkerSettings, tokenizer: Tokenizer) -> EngineClient:
    if settings.engine == "instant":
        from dcoco.bench.instant import InstantEngineClient

        ids = tokenizer.encode(INSTANT_ANSWER)
        return InstantEngineClient(settings.max_model_len or 2048, settings.max_batch_size, ids)
    from dcoco.engine.load import load_engine

    cfg = EngineConfig(
        mode=Mode(settings.mode),
        rule=Rule(settings.rule),
        num_speculative_tokens=settings.num_speculative_tokens,
        top_k=settings.top_k,
        max_batch_size=settings.max_batch_size,
        max_model_len=settings.max_model_len,
        eos_token_ids=tokenizer.eos_token_ids,
    )
    return TorchEngineClient(load_engine(settings.target, settings.drafter, cfg))


async def run_worker(settings: WorkerSettings) -> int:
    """Returns the exit status: 0 after a clean drain, 1 if the engine failed."""
    tokenizer = Tokenizer.from_dir(settings.target)
    tokenizer_json = (settings.target / "tokenizer.json").read_text()
    engine = build_engine_client(settings, tokenizer)
    card = ModelCard(
        name=settings.model_name,
        max_model_len=engine.max_model_len,
        tokenizer_sha=hashlib.sha256(tokenizer_json.encode()).hexdigest()[:16],
        chat_template=tokenizer.chat_template,
        created=int(time.time()),
    )
    worker_id = settings.worker_id or f"{socket.gethostname()}-{os.getpid()}"
    redis = connect(settings.redis_url, timeout_s=2.0)
    blocking = connect(settings.redis_url, timeout_s=3.0)  # XREADGROUP blocks up to 1 s
    queue = WorkerQueue(redis, blocking, settings.model_name, worker_id, settings.lease_s)
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry, settings.model_name)
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_host, registry)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    worker = Worker(settings, engine, tokenizer, queue, metrics, card, tokenizer_json)
    while not stop.is_set():
        try:
            await worker.run(stop)
            break
        except UNAVAILABLE as problem:
            log.warning("Redis unavailable at start, retrying: %s", problem)
            await asyncio.sleep(1.0)
    await engine.close()
    await redis.aclose()
    await blocking.aclose()
    return 1 if engine.failure else 0
