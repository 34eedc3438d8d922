"""Worker loops under injected bugs: a real redis-server, in-process workers and gateway, and a
queue that raises an unexpected exception from the method one loop depends on.

A loop that crashes a few times is restarted and counted while the worker keeps serving; a
loop that keeps crashing makes the worker give up: it hands its requests back, deregisters and
stops, and another worker finishes them.
"""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from dcoco.gateway.app import create_app
from dcoco.queue.client import GatewayQueue
from dcoco.queue.connection import connect
from dcoco.queue.consumer import CancelNotices, WorkerQueue
from dcoco.queue.protocol import ModelCard
from dcoco.settings import GatewaySettings, WorkerSettings
from dcoco.shared.instant import InstantEngineClient
from dcoco.shared.protocol import EngineDelta, EngineRequest
from dcoco.shared.stats import SpecStats
from dcoco.shared.supervisor import LoopFailed
from dcoco.tokenizer import Tokenizer, save_tokenizer, train_tokenizer
from dcoco.worker import worker as worker_module
from dcoco.worker.http import Health
from dcoco.worker.metrics import WorkerMetrics
from dcoco.worker.worker import Worker
from stack import RedisServer

# The queue method each loop calls on every pass.
LOOP_METHODS = {
    "fetch": "read",
    "reclaim": "reclaim",
    "heartbeat": "heartbeat",
    "notices": "next",
    "cancels": "cancelled",
    "flush": "append",
}


class FaultyQueue(WorkerQueue):
    """A real worker queue whose `method` raises RuntimeError on its next `faults` calls."""

    def __init__(self, *args: Any, method: str = "") -> None:
        super().__init__(*args)
        self.method, self.faults = method, 0

    def _maybe_fail(self, method: str) -> None:
        if method == self.method and self.faults > 0:
            self.faults -= 1
            raise RuntimeError(f"injected fault in {method}")

    async def read(self, count: int, block_ms: int) -> Any:
        self._maybe_fail("read")
        return await super().read(count, block_ms)

    async def reclaim(self, count: int) -> Any:
        self._maybe_fail("reclaim")
        return await super().reclaim(count)

    async def heartbeat(self, *args: Any) -> None:
        self._maybe_fail("heartbeat")
        await super().heartbeat(*args)

    async def cancelled(self, request_ids: list[str]) -> dict[str, float]:
        self._maybe_fail("cancelled")
        return await super().cancelled(request_ids)

    async def append(self, writes: Any) -> list[bool]:
        self._maybe_fail("append")
        return await super().append(writes)

    def cancel_notices(self) -> CancelNotices:
        return FaultyNotices(self)


class FaultyNotices(CancelNotices):
    """The real cancel notices, failing with their queue's faults in `next`."""

    def __init__(self, queue: FaultyQueue) -> None:
        super().__init__(queue.redis)
        self.queue = queue

    async def next(self, timeout_s: float) -> tuple[str, float] | None:
        self.queue._maybe_fail("next")
        return await super().next(timeout_s)


class PacedEngine(InstantEngineClient):
    """The instant fixture, one delta every 20 ms: requests stay in flight for a while. Each
    delta reports itself as one speculative cycle: all but its last token accepted drafted
    tokens, and one drafted token rejected."""

    async def generate(self, request: EngineRequest) -> AsyncIterator[EngineDelta]:  # type: ignore[override]
        sent = cycles = 0
        async for delta in super().generate(request):
            await asyncio.sleep(0.02)
            sent, cycles = sent + len(delta.token_ids), cycles + 1
            stats = SpecStats(
                verifications=cycles, draft_tokens=sent, accepted_tokens=sent - cycles
            )
            yield replace(delta, stats=stats)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_tokenizer(["hello world, the quick brown fox"] * 10, 300), folder)
    return folder


class RunningWorker:
    def __init__(self, worker: Worker, task: "asyncio.Task[None]", stop: asyncio.Event) -> None:
        self.worker, self.task, self.stop = worker, task, stop

    def restarts(self, loop: str) -> float:
        value = self.worker.metrics.loop_restarts.labels("m", loop)._value.get()
        return float(value)


async def start_worker(
    server: RedisServer, tokenizer_dir: Path, name: str, method: str = "", times: int = 0
) -> RunningWorker:
    settings = WorkerSettings(
        redis_url=server.url, lease_s=1.0, heartbeat_s=0.2, drain_timeout_s=1.0
    )
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    tokenizer_json = (tokenizer_dir / "tokenizer.json").read_text()
    card = ModelCard(
        name="m",
        max_model_len=2048,
        tokenizer_sha="t",
        chat_template=tokenizer.chat_template,
        created=0,
    )
    redis = connect(server.url, timeout_s=2.0)
    queue = FaultyQueue(redis, redis, "m", name, settings.lease_s, method=method)
    engine = PacedEngine(2048, 8, tokenizer.encode(" the quick brown fox"))
    metrics = WorkerMetrics(CollectorRegistry(), "m")
    health = Health(stale_after_s=settings.lease_s)
    worker = Worker(settings, engine, tokenizer, queue, metrics, card, tokenizer_json, health)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    await until(lambda: health.state != "loading")
    queue.faults = times  # armed once the worker runs its loops
    return RunningWorker(worker, task, stop)


async def until(condition: Callable[[], bool], timeout_s: float = 20) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.02)


def gateway(server: RedisServer) -> httpx.AsyncClient:
    app = create_app(GatewaySettings(redis_url=server.url, queue_timeout_s=10))
    transport = httpx.ASGITransport(app=app)
    return httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30)


async def stream_chat(
    client: httpx.AsyncClient, max_tokens: int, seed: int | None = None
) -> tuple[str, dict[str, Any]]:
    """The streamed text and the usage chunk of one chat request."""
    body: dict[str, Any] = {
        "model": "m",
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if seed is not None:
        body["seed"] = seed
    text, usage = "", {}
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        assert reply.status_code == 200
        lines = [line async for line in reply.aiter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    for line in lines[:-1]:
        chunk = json.loads(line.removeprefix("data: "))
        assert "error" not in chunk, chunk
        if chunk["choices"]:
            text += chunk["choices"][0]["delta"].get("content") or ""
        if chunk.get("usage"):
            usage = chunk["usage"]
    return text, usage


@pytest.mark.parametrize("loop", list(LOOP_METHODS))
async def test_a_crashing_loop_is_restarted_and_the_worker_keeps_serving(
    redis_server: RedisServer, tokenizer_dir: Path, loop: str
) -> None:
    redis_server.client().flushall()
    running = await start_worker(
        redis_server, tokenizer_dir, f"w-{loop}", method=LOOP_METHODS[loop], times=2
    )
    async with gateway(redis_server) as client:
        for _ in range(3):
            text, usage = await stream_chat(client, max_tokens=20)
            assert usage["completion_tokens"] == 20
            assert text.strip()
        await until(lambda: running.restarts(loop) >= 2)  # some loops run only now and then
        assert running.restarts(loop) == 2
        assert not running.task.done()
        assert running.worker.health.live
    running.stop.set()
    await running.task


@pytest.mark.parametrize("seed", [None, 7], ids=["continued", "replayed"])
async def test_a_loop_that_keeps_crashing_hands_its_requests_to_another_worker(
    redis_server: RedisServer, tokenizer_dir: Path, seed: int | None
) -> None:
    redis_server.client().flushall()
    doomed = await start_worker(
        redis_server, tokenizer_dir, "doomed", method="cancelled", times=10**6
    )
    async with gateway(redis_server) as client:
        requests = [asyncio.create_task(stream_chat(client, 2000, seed)) for _ in range(4)]
        await until(lambda: len(doomed.worker.inflight) == 4)
        healthy = await start_worker(redis_server, tokenizer_dir, "healthy")
        with pytest.raises(LoopFailed):
            await asyncio.wait_for(doomed.task, 20)
        assert doomed.worker.health.state == "broken"
        assert not doomed.worker.health.live
        assert doomed.restarts("cancels") == 6  # five tolerated within the minute, then gave up
        assert "doomed" not in redis_server.client().zrange("dcoco:m:workers", 0, -1)
        results = await asyncio.gather(*requests)
        assert [usage["completion_tokens"] for _, usage in results] == [2000] * 4
        # both attempts' speculation: 125 cycles of 16 tokens, wherever the hand-over fell
        speculation = [usage["completion_tokens_details"] for _, usage in results]
        expected = {"accepted_prediction_tokens": 1875, "rejected_prediction_tokens": 125}
        assert [{k: d[k] for k in expected} for d in speculation] == [expected] * 4
    healthy.stop.set()
    await healthy.task


async def cancel_one(
    server: RedisServer, running: RunningWorker, cancel: Callable[[str], Any]
) -> None:
    """Starts a long stream, cancels it with `cancel(request_id)` once the worker runs it, and
    waits for the worker to abort it."""
    async with gateway(server) as client:
        stream = asyncio.create_task(stream_chat(client, 2000))
        await until(lambda: len(running.worker.inflight) == 1)
        (request_id,) = running.worker.inflight
        await cancel(request_id)
        aborted = running.worker.metrics.requests.labels("m", "abort")
        await until(lambda: aborted._value.get() == 1, timeout_s=5)
        assert not running.worker.inflight
        stream.cancel()
    running.stop.set()
    await running.task


async def worker_for_cancels(
    server: RedisServer, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch, sweep_s: float
) -> tuple[RunningWorker, Any]:
    """A fresh Redis, a worker sweeping cancel flags every `sweep_s`, and a client."""
    server.client().flushall()
    monkeypatch.setattr(worker_module, "CANCEL_SWEEP_S", sweep_s)
    running = await start_worker(server, tokenizer_dir, "w-cancels")
    return running, connect(server.url)


async def test_a_cancel_notice_aborts_the_request_without_waiting_for_the_sweep(
    redis_server: RedisServer, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, redis = await worker_for_cancels(redis_server, tokenizer_dir, monkeypatch, 60.0)
    await cancel_one(redis_server, running, lambda r: GatewayQueue(redis, redis).cancel([r]))
    assert running.restarts("notices") == 0


async def test_the_sweep_catches_a_cancel_whose_notice_was_missed(
    redis_server: RedisServer, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, redis = await worker_for_cancels(redis_server, tokenizer_dir, monkeypatch, 0.1)
    await cancel_one(redis_server, running, lambda r: redis.set(f"dcoco:cancel:{r}", "1.5"))


async def test_malformed_cancel_notices_are_skipped(
    redis_server: RedisServer, tokenizer_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    running, redis = await worker_for_cancels(redis_server, tokenizer_dir, monkeypatch, 60.0)

    async def hostile_then_real(request_id: str) -> None:
        for notice in ["", "no-time", f"{request_id} nan", f"{request_id} inf", "x" * 100_000]:
            await redis.publish("dcoco:cancels", notice)
        await redis.publish("dcoco:cancels", f"someone-else {1.0}")
        await asyncio.sleep(0.3)
        assert running.worker.inflight, "a malformed notice cancelled the request"
        await GatewayQueue(redis, redis).cancel([request_id])

    await cancel_one(redis_server, running, hostile_then_real)
    assert running.restarts("notices") == 0
