"""The worker: consumes its model's request stream and drives one engine.

Loops, all on one asyncio loop (the engine steps on its own thread):
- fetch: read up to the engine's free capacity from the consumer group;
- reclaim: take over entries whose worker missed its lease (XAUTOCLAIM);
- heartbeat: stay registered and keep the leases of in-flight entries fresh;
- notices: abort requests whose clients went away, as the gateway's notices arrive;
- cancels: every CANCEL_SWEEP_S, read the cancel flags of the requests in flight, for notices
  the worker missed (published before it subscribed, or during a Redis outage);
- flush: write every request's events, batched into one round trip per wake-up.
Each loop runs under a Supervisor: a crash is logged and the loop restarted; a loop that keeps
crashing makes the worker give up (hand its requests back, deregister, exit non-zero).
SIGTERM stops fetching, lets in-flight requests finish for `drain_timeout_s`, then hands the
rest back to the stream for another worker.
"""

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field

from pydantic import ValidationError
from redis.exceptions import ResponseError

from dcoco.queue.connection import UNAVAILABLE, back_off
from dcoco.queue.consumer import Delivery, WorkerQueue
from dcoco.queue.protocol import ModelCard
from dcoco.settings import WorkerSettings
from dcoco.shared.protocol import EngineClient
from dcoco.shared.supervisor import LoopFailed, Supervisor
from dcoco.tokenizer import Tokenizer
from dcoco.worker.http import Health
from dcoco.worker.metrics import WorkerMetrics
from dcoco.worker.outbox import Outbox
from dcoco.worker.request import RequestRun

log = logging.getLogger(__name__)
CANCEL_SWEEP_S = 0.5


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
        health: Health,
    ) -> None:
        self.settings, self.engine, self.tokenizer = settings, engine, tokenizer
        self.queue, self.metrics, self.card = queue, metrics, card
        self.tokenizer_json, self.health = tokenizer_json, health
        self.supervisor = Supervisor(
            on_restart=lambda loop: metrics.loop_restarts.labels(card.name, loop).inc()
        )
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
        """Serves until `stop` is set, then drains. Raises LoopFailed if a loop kept crashing:
        the worker has then stopped heartbeating and handed its requests back."""
        self.stop = stop
        await self.queue.register(self.card, self.tokenizer_json)
        await self.queue.heartbeat([], self.card, self.tokenizer_json, self.info)
        self.health.state = "ready"
        log.info("worker ready", extra={"model": self.card.name, "worker": self.queue.worker_id})
        loops = {
            "fetch": self._fetch,
            "reclaim": self._reclaim,
            "heartbeat": self._heartbeat,
            "notices": self._hear_cancels,
            "cancels": self._sweep_cancels,
            "flush": self.outbox.run,
        }
        try:
            async with asyncio.TaskGroup() as group:
                tasks = [group.create_task(self.supervisor.keep(n, f)) for n, f in loops.items()]
                await stop.wait()
                self.health.state = "draining"
                self.accepting = False
                await self._drain()
                for task in tasks:
                    task.cancel()
        except* LoopFailed as failed:
            self.health.state = "broken"
            self.accepting = False
            log.error("giving up: %s", failed.exceptions[0])
            await self._hand_back_all()
            raise failed.exceptions[0] from None
        finally:
            with contextlib.suppress(*UNAVAILABLE):
                await self.queue.deregister()
        self.health.state = "stopped"

    @property
    def free(self) -> int:
        return self.engine.max_concurrency - len(self.inflight)

    async def _fetch(self) -> None:
        failures = 0
        while self.accepting:
            if self.free <= 0:
                self.slot_freed.clear()
                await self.slot_freed.wait()
                continue
            try:
                deliveries = await self.queue.read(self.free, block_ms=1000)
            except UNAVAILABLE as problem:
                failures += 1
                await back_off("fetch", problem, failures)
                continue
            except ResponseError as problem:  # NOGROUP: Redis restarted empty
                log.warning("re-registering: %s", problem)
                await self.queue.register(self.card, self.tokenizer_json)
                continue
            failures = 0
            for delivery in deliveries:
                self._start(delivery)

    async def _reclaim(self) -> None:
        while self.accepting:
            await asyncio.sleep(self.settings.lease_s / 4)
            if self.free > 0:
                try:
                    deliveries = await self.queue.reclaim(self.free)
                except (*UNAVAILABLE, ResponseError):
                    continue  # the next sweep retries
                for delivery in deliveries:
                    log.info("reclaimed", extra={"entry": delivery.entry_id})
                    self._start(delivery)

    async def _heartbeat(self) -> None:
        while True:
            self.health.tick()
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

    async def _hear_cancels(self) -> None:
        notices = self.queue.cancel_notices()
        failures = 0
        try:
            while True:
                try:
                    notice = await notices.next(timeout_s=CANCEL_SWEEP_S)
                except UNAVAILABLE as problem:
                    failures += 1
                    await back_off("cancel notices", problem, failures)
                    continue
                failures = 0
                if notice is not None:
                    await self._cancel(*notice)
        finally:
            with contextlib.suppress(*UNAVAILABLE):
                await notices.close()

    async def _sweep_cancels(self) -> None:
        while True:
            await asyncio.sleep(CANCEL_SWEEP_S)
            waiting = [r for r, f in self.inflight.items() if f.cancelled_at is None]
            try:
                cancelled = await self.queue.cancelled(waiting)
            except UNAVAILABLE:
                continue  # swept again in CANCEL_SWEEP_S
            for request_id, when in cancelled.items():
                await self._cancel(request_id, when)

    async def _cancel(self, request_id: str, when: float) -> None:
        """Aborts a request of ours whose client went away at `when` (unix seconds); a request
        of another worker's, or one already being cancelled, is left alone."""
        flight = self.inflight.get(request_id)
        if flight is not None and flight.cancelled_at is None:
            flight.cancelled_at = when
            await flight.run.cancel()

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
        except Exception:  # a bug in one request must not take the worker down: answer it
            log.exception("request failed", extra={"request": request_id})
            self.metrics.requests.labels(self.card.name, "error").inc()
            flight.run.fail_internal()
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
        await self._hand_back_all()

    async def _hand_back_all(self) -> None:
        """Stops every request still running and parks its entry for another worker."""
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
