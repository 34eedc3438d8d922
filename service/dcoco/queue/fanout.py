"""One blocking XREAD for every response stream a gateway follows.

Each request's events used to arrive through an XREAD of its own: at 32 streams, 32 blocked
reads, each woken once an engine step, each a round trip with its own socket calls; on 2 CPU
cores shared with the model that was most of the gateway's CPU. One reader now blocks on all
followed streams at once and hands each follower its entries, a round trip a step whatever
the number of streams.

A stream followed while the read is blocked joins at the next read: the reader also blocks on
a wake stream of its own, to which `follow` adds an entry, so that a new request never waits
out a blocked read (`block_s`). The reader stops when nobody follows anything, and the next
`follow` starts it again. If a read fails (Redis unreachable; a key of another type where a
response stream should be), every follower of the moment gets the error, as each of its own
reads would have raised it, and the next `follow` starts a fresh reader.
"""

import asyncio
import uuid
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import RedisError

from dcoco.queue import keys
from dcoco.queue.connection import Entry, stream_entries

COUNT = 256  # entries a read takes from each stream at most
WAKE_TTL_S = 60  # a wake stream outlives its gateway's last wake-up by this much


class Follower:
    """One stream's entries as the reader hands them over, in order."""

    def __init__(self) -> None:
        self.last_id = "0-0"  # the last entry handed over: a stream is read from its start
        self.inbox: asyncio.Queue[list[Entry] | RedisError] = asyncio.Queue()


class Fanout:
    def __init__(self, blocking: Redis, redis: Redis, block_s: float) -> None:
        """`blocking` serves the XREAD BLOCK calls; `redis`, the wake-ups."""
        self.blocking, self.redis = blocking, redis
        self.block_ms = int(block_s * 1000)
        self.wake = keys.wake(uuid.uuid4().hex)
        self.wake_id = "0-0"
        self.followers: dict[str, Follower] = {}
        self.reader: asyncio.Task[None] | None = None

    async def follow(self, stream: str) -> Follower:
        """Starts handing over `stream`'s entries; call `unfollow` when done with them."""
        follower = self.followers[stream] = Follower()
        if self.reader is None:
            self.reader = asyncio.create_task(self._read())
            return follower
        try:
            async with self.redis.pipeline(transaction=False) as pipe:
                pipe.xadd(self.wake, {"w": "1"}, maxlen=1, approximate=False)
                pipe.expire(self.wake, WAKE_TTL_S)
                await pipe.execute()
        except BaseException:
            self.unfollow(stream)
            raise
        return follower

    def unfollow(self, stream: str) -> None:
        self.followers.pop(stream, None)

    async def _read(self) -> None:
        try:
            while self.followers:
                ids: dict[Any, Any] = {self.wake: self.wake_id}  # stream -> the last id read
                ids.update((s, f.last_id) for s, f in self.followers.items())
                reply = await self.blocking.xread(ids, count=COUNT, block=self.block_ms)
                for stream, last_id, entries in _by_stream(reply):
                    if stream == self.wake:
                        self.wake_id = last_id
                    elif (follower := self.followers.get(stream)) is not None:
                        follower.last_id = last_id
                        if entries:
                            follower.inbox.put_nowait(entries)
        except RedisError as problem:
            for follower in self.followers.values():
                follower.inbox.put_nowait(problem)
            self.followers.clear()
        finally:
            self.reader = None

    async def close(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.gather(self.reader, return_exceptions=True)


def _by_stream(reply: Any) -> list[tuple[str, str, list[Entry]]]:
    """An XREAD reply (RESP2: [[stream, [[id, fields]...]]...]) as (stream, the last id read,
    its entries less deleted ones)."""
    return [
        (str(stream), str(raw[-1][0]), stream_entries(raw)) for stream, raw in reply or [] if raw
    ]
