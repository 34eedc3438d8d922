"""The gateway's side of the queue: enqueue, follow a request's events, cancel, observe."""

import asyncio
import time
from collections.abc import AsyncIterator

from redis.asyncio import Redis

from dcoco.queue import keys, scripts
from dcoco.queue.fanout import Fanout
from dcoco.queue.protocol import Envelope, Event, ModelCard


class QueueTimeout(Exception):
    """No event arrived in time: the request was never picked up (started False), or its
    worker stalled after taking it up (started True)."""

    def __init__(self, request_id: str, started: bool) -> None:
        super().__init__(request_id)
        self.started = started


class GatewayQueue:
    def __init__(self, redis: Redis, blocking: Redis) -> None:
        """`blocking` serves XREAD BLOCK calls; its socket timeout must exceed BLOCK_S."""
        self.redis = redis
        self.fanout = Fanout(blocking, redis, self.BLOCK_S)
        self._enqueue = redis.register_script(scripts.ENQUEUE)
        self._depth = redis.register_script(scripts.DEPTH)

    BLOCK_S = 1.0

    async def enqueue(self, envelopes: list[Envelope], max_waiting: int) -> bool:
        """Adds all envelopes of one HTTP request atomically; False when the queue is full."""
        stream = keys.requests(envelopes[0].model)
        bodies = [e.model_dump_json() for e in envelopes]
        waiting = await self._enqueue(keys=[stream], args=[keys.GROUP, max_waiting, *bodies])
        return int(waiting) >= 0

    async def events(
        self, request_id: str, first_timeout_s: float, stall_timeout_s: float
    ) -> AsyncIterator[Event]:
        """The request's events in order, once each, until a done or error event.

        Until a worker starts the request, the wait is bounded by `first_timeout_s`; after
        that, by `stall_timeout_s` between events. Events are deduplicated by `seq`, so a
        reclaimed request's second attempt never repeats what the first one delivered.
        """
        stream, last_seq = keys.response(request_id), -1
        deadline = time.monotonic() + first_timeout_s
        started = False
        follower = await self.fanout.follow(stream)
        try:
            while True:
                try:
                    async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                        entries = await follower.inbox.get()
                except TimeoutError:
                    raise QueueTimeout(request_id, started) from None
                if not isinstance(entries, list):
                    raise entries
                for _, fields in entries:
                    event = Event.model_validate_json(fields["e"])
                    if event.kind != "start" and event.seq <= last_seq:
                        continue
                    last_seq = max(last_seq, event.seq)
                    started = True
                    deadline = time.monotonic() + stall_timeout_s
                    yield event
                    if event.kind in ("done", "error"):
                        return
        finally:
            self.fanout.unfollow(stream)

    async def cancel(self, request_ids: list[str]) -> None:
        """Tells workers to stop: a flag per request, whose value is the time of cancellation
        (unix seconds), and a notice on the cancels channel for the workers listening now."""
        now = repr(time.time())
        async with self.redis.pipeline(transaction=False) as pipe:
            for request_id in request_ids:
                pipe.set(keys.cancel(request_id), now, ex=keys.CANCEL_TTL_S)
                pipe.publish(keys.CANCELS, f"{request_id} {now}")
            await pipe.execute()

    async def depth(self, model: str) -> int:
        return int(await self._depth(keys=[keys.requests(model)], args=[keys.GROUP]))

    async def live_workers(self, model: str, lease_s: float) -> int:
        since = (time.time() - lease_s) * 1000
        return int(await self.redis.zcount(keys.workers(model), since, "+inf"))

    async def cards(self) -> dict[str, ModelCard]:
        members = await self.redis.smembers(keys.MODELS)  # type: ignore[misc]  # redis-py 7 stubs
        names = sorted(str(n) for n in members)
        raw = await self.redis.mget([keys.model_card(n) for n in names]) if names else []
        cards = [ModelCard.model_validate_json(r) for r in raw if r is not None]
        return {card.name: card for card in cards}

    async def tokenizer_json(self, sha: str) -> str | None:
        value = await self.redis.get(keys.tokenizer(sha))
        return None if value is None else str(value)

    async def close(self) -> None:
        await self.fanout.close()

    async def ping(self) -> None:
        await self.redis.ping()  # type: ignore[misc]  # redis-py 7 stubs type both clients
