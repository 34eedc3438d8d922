"""The worker: consumes its model's request stream and drives one engine.

Loops, all on one asyncio loop (the engine steps on its own thread):
- fetch: read up to the engine's free capacity from the consumer group;
- reclaim: take over entries whose worker missed its lease (XAUTOCLAIM);
- heartbeat: stay registered and keep the leases of in-flight entries fresh;
- cancels: abort requests whose clients went away;
- flush: write every request's events, batched into one round trip per wake-up.
SIGTERM stops fetching, lets in-flight requests finish for `drain_timeout_s`, then hands the
rest back to the stream for another worker.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from pydantic import ValidationError
from redis.exceptions import ResponseError

from dcoco.queue.connection import UNAVAILABLE
from dcoco.queue.consumer import Delivery, WorkerQueue
from dcoco.queue.protocol import ModelCard
from dcoco.settings import WorkerSettings
from dcoco.tokenizer import Tokenizer
from dcoco.worker.engine_client import EngineClient
from dcoco.worker.metrics import WorkerMetrics
from dcoco.worker.outbox import Outbox
from dcoco.worker.request import RequestRun

log = logging.getLogger(__name__)
CANCEL_POLL_S = 0.02


@dataclass
class InFlight:
    delivery: Delivery
    run: RequestRun
    task: asyncio.Task[None] | None = None
    cancelled_at: float | None = field(default=None)


class Worker:
    def __init__(
        self,
        settings: WorkerSettings,
        engine: EngineClient,
        tokenizer: Tokenizer,
        queue: WorkerQueue,
        metrics: WorkerMetrics,
        card: ModelCard,
        tokenizer_json: str,
    ) -> None:
        self.settings, self.engine, self.tokenizer = settings, engine, tokenizer
        self.queue, self.metrics, self.card = queue, metrics, card
        self.tokenizer_json = tokenizer_json
        self.inflight: dict[str, InFlight] = {}
        self.accepting = True
        self.stop = asyncio.Event()
        self.slot_freed = asyncio.Event()
        self.outbox = Outbox(queue, on_lost=self._lost, on_outage=self._outage)

    @property
    def info(self) -> dict[str, object]:
        return {
            "model": self.card.name,
            "capacity": self.engine.max_concurrency,
            "busy": len(self.inflight),
        }

    async def run(self, stop: asyncio.Event) -> None:
        self.stop = stop
        await self.queue.register(self.card, self.tokenizer_json)
        await self.queue.heartbeat([], self.card, self.tokenizer_json, self.info)
        log.info("worker ready", extra={"model": self.card.name, "worker": self.queue.worker_id})
        loops = [
            self._fetch(),
            self._reclaim(),
            self._heartbeat(),
            self._watch_cancels(),
            self.outbox.run(),
        ]
        tasks = [asyncio.create_task(loop) for loop in loops]
        await stop.wait()
        self.accepting = False
        await self._drain()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        try:
            await self.queue.deregister()
        except UNAVAILABLE:
            log.warning("could not deregister: Redis unavailable")

    @property
    def free(self) -> int:
        return self.engine.max_concurrency - len(self.inflight)

    async def _fetch(self) -> None:
        while self.accepting:
            if self.free <= 0:
                self.slot_freed.clear()
                await self.slot_freed.wait()
                continue
            try:
                deliveries = await self.queue.read(self.free, block_ms=1000)
            except UNAVAILABLE:
                await asyncio.sleep(0.5)
                continue
            except ResponseError as problem:  # NOGROUP: Redis restarted empty
                log.warning("re-registering: %s", problem)
                await self.queue.register(self.card, self.tokenizer_json)
                continue
            for delivery in deliveries:
                self._start(delivery)

    async def _reclaim(self) -> None:
        while self.accepting:
            await asyncio.sleep(self.settings.lease_s / 4)
            if self.free > 0:
                try:
                    deliveries = await self.queue.reclaim(self.free)
                except (*UNAVAILABLE, ResponseError):
                    continue
                for delivery in deliveries:
                    log.info("reclaimed", extra={"entry": delivery.entry_id})
                    self._start(delivery)

    async def _heartbeat(self) -> None:
        while True:
            if self.engine.failure is not None:
                log.error("the engine failed; stopping the worker")
                self.stop.set()
            try:
                entries = [f.delivery.entry_id for f in self.inflight.values()]
                await self.queue.heartbeat(entries, self.card, self.tokenizer_json, self.info)
                await self.outbox.drop_orphans()
            except UNAVAILABLE:
                log.warning("heartbeat failed: Redis unavailable")
            await asyncio.sleep(self.settings.heartbeat_s)

    async def _watch_cancels(self) -> None:
        while True:
            await asyncio.sleep(CANCEL_POLL_S)
            waiting = [r for r, f in self.inflight.items() if f.cancelled_at is None]
            try:
                cancelled = await self.queue.cancelled(waiting)
            except UNAVAILABLE:
                continue
            for request_id, when in cancelled.items():
                flight = self.inflight.get(request_id)
                if flight is not None:
                    flight.cancelled_at = when
                    flight.run.cancel()

    def _start(self, delivery: Delivery) -> None:
        envelope = delivery.envelope
        if envelope is None:
            log.error(
                "malformed request entry dropped",
                extra={"entry": delivery.entry_id, "problem": delivery.problem},
            )
            self.metrics.requests.labels(self.card.name, "malformed").inc()
            self.outbox.orphan(delivery.entry_id)
            return
        run = RequestRun(
            envelope, delivery, self.engine, self.tokenizer, self.outbox, self.metrics, self.queue
        )
        flight = InFlight(delivery, run)
        self.inflight[envelope.id] = flight
        flight.task = asyncio.create_task(self._serve(envelope.id, flight))

    async def _serve(self, request_id: str, flight: InFlight) -> None:
        try:
            outcome = await flight.run.execute()
            if outcome == "abort" and flight.cancelled_at is not None:
                self.metrics.cancel_latency.labels(self.card.name).observe(
                    time.time() - flight.cancelled_at
                )
            self.metrics.requests.labels(self.card.name, outcome).inc()
        except UNAVAILABLE:
            log.warning("request dropped: Redis unavailable", extra={"request": request_id})
            self.outbox.orphan(flight.delivery.entry_id)
        except (ValidationError, KeyError):
            log.error(
                "request dropped: malformed events in its response stream",
                extra={"request": request_id},
            )
            self.metrics.requests.labels(self.card.name, "malformed").inc()
            self.outbox.orphan(flight.delivery.entry_id)
        finally:
            self.inflight.pop(request_id, None)
            self.slot_freed.set()
            self._observe_stats()

    def _observe_stats(self) -> None:
        for cycle in self.engine.drain_stats():
            self.metrics.observe_cycle(cycle)

    def _lost(self, request_id: str) -> None:
        """Another worker owns the request now: stop working on it, write nothing more."""
        flight = self.inflight.get(request_id)
        if flight is not None and flight.task is not None:
            flight.task.cancel()

    def _outage(self) -> None:
        """Events cannot be delivered: every client has been given an error by now."""
        for flight in list(self.inflight.values()):
            if flight.task is not None:
                flight.task.cancel()
            self.outbox.orphan(flight.delivery.entry_id)

    async def _drain(self) -> None:
        deadline = time.monotonic() + self.settings.drain_timeout_s
        while self.inflight and time.monotonic() < deadline:
            self.slot_freed.clear()
            try:
                await asyncio.wait_for(self.slot_freed.wait(), deadline - time.monotonic())
            except TimeoutError:
                break
        left = list(self.inflight.values())
        for flight in left:
            if flight.task is not None:
                flight.task.cancel()
        await asyncio.gather(*(f.task for f in left if f.task), return_exceptions=True)
        try:
            await self.outbox.flush_now()
            await self.queue.hand_back([f.delivery.entry_id for f in left])
        except UNAVAILABLE:
            log.warning("could not hand back %d requests: Redis unavailable", len(left))
        if left:
            log.info("handed back unfinished requests", extra={"count": len(left)})


async def _forever(loop: Callable[[], Awaitable[None]]) -> None:
    """The outermost worker loop: a bug in one loop is logged and the loop restarted, rather
    than leaving the worker alive but deaf."""
    while True:
        try:
            await loop()
            return
        except asyncio.CancelledError:
            raise
        except Exception:  # the outermost loop; everything expected is handled inside
            log.exception("worker loop %s failed; restarting it", loop.__name__)
            await asyncio.sleep(1.0)
