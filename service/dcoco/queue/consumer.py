"""The worker's side of the queue: read and reclaim requests, own them, write their events.

Ownership: taking up a request (fresh or reclaimed) bumps its attempt number in the owner key.
Every event write and the final acknowledgement are fenced on that key, so once another worker
has reclaimed a request the previous owner can no longer write to it.

Leases: a worker heartbeats every few seconds, which also resets the idle time of the stream
entries it is working on. An entry idle for longer than the lease therefore belongs to a worker
that stopped heartbeating, and XAUTOCLAIM hands it to a live one.
"""

import json
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from dcoco.queue import keys, scripts
from dcoco.queue.connection import stream_entries
from dcoco.queue.protocol import Envelope, Event, ModelCard

HANDOFF_CONSUMER = "handoff"  # entries parked here are reclaimable at once
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Delivery:
    entry_id: str
    envelope: Envelope | None  # None: the entry was malformed (see `problem`)
    reclaimed: bool
    problem: str = ""


@dataclass
class Ownership:
    """A worker's hold on one request, and what earlier attempts already delivered."""

    request_id: str
    token: str  # "{worker} {attempt}", the fence for every write
    attempt: int
    next_seq: int = 0
    emitted_ids: list[int] = field(default_factory=list)
    sent_text: str = ""
    accepted: int = 0  # drafted tokens accepted behind emitted_ids, over the earlier attempts
    rejected: int = 0  # and rejected
    finished: bool = False  # an earlier attempt already wrote done or error


class WorkerQueue:
    def __init__(self, redis: Redis, blocking: Redis, model: str, worker_id: str, lease_s: float):
        self.redis, self.blocking = redis, blocking
        self.model, self.worker_id, self.lease_s = model, worker_id, lease_s
        self.stream = keys.requests(model)
        self._claim = redis.register_script(scripts.CLAIM)
        self._append = redis.register_script(scripts.APPEND)

    async def register(self, card: ModelCard, tokenizer_json: str) -> None:
        """Publishes the model card (kept when the worker stops, so the model stays known at
        zero workers) and creates the consumer group if it does not exist."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.set(keys.tokenizer(card.tokenizer_sha), tokenizer_json)
            pipe.set(keys.model_card(card.name), card.model_dump_json())
            pipe.sadd(keys.MODELS, card.name)
            pipe.xgroup_create(self.stream, keys.GROUP, id="0", mkstream=True)
            await pipe.execute(raise_on_error=False)  # BUSYGROUP: the group already exists

    async def heartbeat(
        self, entry_ids: list[str], card: ModelCard, tokenizer_json: str, info: dict[str, object]
    ) -> None:
        """Marks this worker alive and resets the idle time of the entries it holds. If Redis
        lost the model card or the group (a restart without persistence), registers again."""
        now = time.time()
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zadd(keys.workers(self.model), {self.worker_id: now * 1000})
            pipe.set(keys.worker(self.worker_id), json.dumps(info), ex=max(1, int(self.lease_s)))
            pipe.exists(keys.model_card(card.name))
            pipe.exists(keys.tokenizer(card.tokenizer_sha))
            pipe.exists(self.stream)
            if entry_ids:
                pipe.xclaim(
                    self.stream, keys.GROUP, self.worker_id, 0, list[Any](entry_ids), justid=True
                )
            pipe.zremrangebyscore(
                keys.workers(self.model), "-inf", (now - 60 * self.lease_s) * 1000
            )
            _, _, has_card, has_tokenizer, has_stream, *_ = await pipe.execute(raise_on_error=False)
        if not (has_card and has_tokenizer and has_stream):
            await self.register(card, tokenizer_json)

    async def read(self, count: int, block_ms: int) -> list[Delivery]:
        reply = await self.blocking.xreadgroup(
            keys.GROUP, self.worker_id, {self.stream: ">"}, count=count, block=block_ms
        )
        return [_delivery(entry_id, fields, False) for entry_id, fields in stream_entries(reply)]

    async def reclaim(self, count: int) -> list[Delivery]:
        """Entries whose owner missed its lease, now ours."""
        reply = await self.redis.xautoclaim(
            self.stream, keys.GROUP, self.worker_id, int(self.lease_s * 1000), "0-0", count=count
        )
        return [_delivery(entry_id, fields, True) for entry_id, fields in stream_entries(reply[1])]

    async def own(
        self, request_id: str, reclaimed: bool, announce: bool = True
    ) -> Ownership | None:
        """Takes ownership (announcing the start to the reader unless told not to); for a
        reclaimed request, also reads what earlier attempts delivered. None: the client has
        cancelled the request, which nobody should run any more."""
        args: list[Any] = [self.worker_id, keys.OWNER_TTL_S, keys.RESPONSE_TTL_S, int(announce)]
        request_keys = [keys.owner(request_id), keys.response(request_id), keys.cancel(request_id)]
        attempt = int(await self._claim(keys=request_keys, args=args))
        if not attempt:
            return None
        owned = Ownership(request_id, f"{self.worker_id} {attempt}", attempt)
        if reclaimed or attempt > 1:
            for _, fields in stream_entries(await self.redis.xrange(keys.response(request_id))):
                event = Event.model_validate_json(fields["e"])
                if event.kind == "start":
                    continue
                owned.next_seq = max(owned.next_seq, event.seq + 1)
                owned.emitted_ids += event.token_ids
                owned.sent_text += event.text
                owned.accepted += event.accepted
                owned.rejected += event.rejected
                owned.finished = owned.finished or event.kind != "delta"
        return owned

    async def append(self, writes: list[tuple[Ownership, Event | None, str]]) -> list[bool]:
        """Fenced writes in one round trip: (owner, event or None, entry id to acknowledge or
        ''). Returns, per write, whether this worker still owned the request.

        The script runs by its SHA: redis-py would otherwise ask Redis whether a pipeline's
        scripts exist before each one, a second round trip per flush. A Redis that lost the
        script (restarted) refuses every write of the batch, so it is loaded and the batch sent
        again."""
        try:
            return await self._append_batch(writes)
        except NoScriptError:
            await self.redis.script_load(scripts.APPEND)
            return await self._append_batch(writes)

    async def _append_batch(self, writes: list[tuple[Ownership, Event | None, str]]) -> list[bool]:
        async with self.redis.pipeline(transaction=False) as pipe:
            for owned, event, entry_id in writes:
                body = event.model_dump_json(exclude_defaults=True) if event else ""
                pipe.evalsha(
                    self._append.sha,
                    3,
                    keys.owner(owned.request_id),
                    keys.response(owned.request_id),
                    self.stream,
                    owned.token,
                    keys.RESPONSE_TTL_S,
                    body,
                    keys.GROUP,
                    entry_id,
                )
            return [bool(ok) for ok in await pipe.execute()]

    async def drop(self, entry_id: str) -> None:
        """Acknowledges and deletes an entry nobody will answer (malformed, or cancelled)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.xack(self.stream, keys.GROUP, entry_id)
            pipe.xdel(self.stream, entry_id)
            await pipe.execute()

    async def cancelled(self, request_ids: list[str]) -> dict[str, float]:
        """Requests whose clients went away -> when (unix seconds)."""
        if not request_ids:
            return {}
        values = await self.redis.mget([keys.cancel(r) for r in request_ids])
        return {r: float(v) for r, v in zip(request_ids, values, strict=True) if v is not None}

    def cancel_notices(self) -> "CancelNotices":
        return CancelNotices(self.redis)

    async def hand_back(self, entry_ids: list[str]) -> None:
        """Parks entries so that any live worker reclaims them at its next sweep."""
        if entry_ids:
            idle = int(self.lease_s * 1000) + 1
            await self.redis.xclaim(
                self.stream,
                keys.GROUP,
                HANDOFF_CONSUMER,
                0,
                list[Any](entry_ids),
                idle=idle,
                justid=True,
            )

    async def deregister(self) -> None:
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.zrem(keys.workers(self.model), self.worker_id)
            pipe.delete(keys.worker(self.worker_id))
            await pipe.execute()
        pending = await self.redis.xpending_range(
            self.stream, keys.GROUP, min="-", max="+", count=1, consumername=self.worker_id
        )
        if not pending:
            await self.redis.xgroup_delconsumer(self.stream, keys.GROUP, self.worker_id)


def _delivery(entry_id: str, fields: dict[str, str], reclaimed: bool) -> Delivery:
    try:
        return Delivery(entry_id, Envelope.model_validate_json(fields.get("r", "")), reclaimed)
    except ValidationError as bad:
        return Delivery(entry_id, None, reclaimed, problem=str(bad.errors()[0]["msg"]))


class CancelNotices:
    """The cancels channel as one worker hears it. Notices published while it is not subscribed
    (before its first `next`, or while Redis is away) are lost; the worker's sweep of the
    cancel flags catches those."""

    def __init__(self, redis: Redis) -> None:
        self.pubsub = redis.pubsub(ignore_subscribe_messages=True)

    async def next(self, timeout_s: float) -> tuple[str, float] | None:
        """The next notice (request id, unix seconds of the cancel), or None after `timeout_s`
        without one. A malformed notice is logged and skipped."""
        if not self.pubsub.subscribed:
            await self.pubsub.subscribe(keys.CANCELS)
        message = await self.pubsub.get_message(ignore_subscribe_messages=True, timeout=timeout_s)
        if message is None:
            return None
        notice = str(message["data"])
        request_id, _, when = notice.partition(" ")
        try:
            seconds = float(when)
        except ValueError:
            seconds = math.nan
        if not (request_id and math.isfinite(seconds)):
            log.warning("malformed cancel notice skipped", extra={"notice": notice[:200]})
            return None
        return request_id, seconds

    async def close(self) -> None:
        await self.pubsub.aclose()
