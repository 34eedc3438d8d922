"""Batched, fenced event writes, plus the entries to acknowledge once Redis is reachable."""

import asyncio
import logging
import time
from collections.abc import Callable

from dcoco.queue.connection import UNAVAILABLE, back_off
from dcoco.queue.consumer import Ownership, WorkerQueue
from dcoco.queue.protocol import Event

log = logging.getLogger(__name__)
OUTAGE_GRACE_S = 3.0  # after this long without Redis, gateways have failed their clients


class Outbox:
    def __init__(
        self,
        queue: WorkerQueue,
        on_lost: Callable[[str], None],
        on_outage: Callable[[], None],
    ) -> None:
        """on_lost(request id): another worker owns it now. on_outage(): writes failed for
        OUTAGE_GRACE_S, pending events were discarded."""
        self.queue, self.on_lost, self.on_outage = queue, on_lost, on_outage
        self.items: list[tuple[Ownership, Event | None, str]] = []
        self.orphans: set[str] = set()
        self.ready = asyncio.Event()

    def put(self, owned: Ownership, event: Event | None, ack_entry: str = "") -> None:
        """Queues an event; with `ack_entry`, the write also acknowledges and deletes the
        request's stream entry, atomically with the event."""
        self.items.append((owned, event, ack_entry))
        self.ready.set()

    def orphan(self, entry_id: str) -> None:
        """An entry to acknowledge and delete without any event (nobody is listening)."""
        self.orphans.add(entry_id)

    async def run(self) -> None:
        while True:
            if not self.items:  # after a restart, what the crashed flush held goes out at once
                await self.ready.wait()
            self.ready.clear()
            await self.flush_now()

    async def flush_now(self) -> None:
        started = time.monotonic()
        failures = 0
        while self.items:
            batch, self.items = self.items, []
            try:
                results = await self.queue.append(batch)
            except BaseException as problem:
                self.items = batch + self.items  # nothing is lost, whatever went wrong
                if not isinstance(problem, UNAVAILABLE):
                    raise
                if time.monotonic() - started > OUTAGE_GRACE_S:
                    log.error("Redis unavailable: dropping %d events", len(self.items))
                    self.items = []
                    self.on_outage()
                    return
                failures += 1
                await back_off("event write", problem, failures)
                continue
            for (owned, _, _), owned_still in zip(batch, results, strict=True):
                if not owned_still:
                    self.on_lost(owned.request_id)

    async def drop_orphans(self) -> None:
        for entry_id in list(self.orphans):
            await self.queue.drop(entry_id)
            self.orphans.discard(entry_id)
