"""The gateway's reads of its response streams on a real redis-server: one blocked read for
every stream it follows, each follower its own events in order, a stream followed while the
read is blocked served at once, and an unreachable Redis reaching every follower."""

import asyncio
import time
import uuid
from pathlib import Path
from typing import Literal

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis

from dcoco.queue import keys
from dcoco.queue.client import GatewayQueue
from dcoco.queue.connection import UNAVAILABLE, connect
from dcoco.queue.protocol import Event
from stack import RedisServer

Kind = Literal["delta", "done"]


async def write(redis: Redis, request_id: str, seq: int, kind: Kind = "delta") -> None:
    event = Event(kind=kind, seq=seq, attempt=1, text=f"{request_id}:{seq}")
    await redis.xadd(keys.response(request_id), {"e": event.model_dump_json()})


async def read_all(queue: GatewayQueue, request_id: str) -> list[str]:
    return [event.text async for event in queue.events(request_id, 10.0, 10.0)]


async def blocked_clients(redis: Redis) -> int:
    return int((await redis.info("clients"))["blocked_clients"])


async def test_every_followed_stream_shares_one_blocked_read(redis_server: RedisServer) -> None:
    redis = connect(redis_server.url, timeout_s=2.0)
    blocking = connect(redis_server.url, timeout_s=GatewayQueue.BLOCK_S + 1.0)
    queue = GatewayQueue(redis, blocking)
    ids = [f"fan-{uuid.uuid4().hex[:8]}" for _ in range(8)]
    readers = [asyncio.create_task(read_all(queue, request_id)) for request_id in ids]
    await asyncio.sleep(0.2)
    assert await blocked_clients(redis) == 1  # one XREAD for all 8 (each its own: 8)
    before = (await redis.info("commandstats")).get("cmdstat_xread", {}).get("calls", 0)
    for seq in range(5):  # 5 engine steps, each writing every stream's next event at once
        async with redis.pipeline(transaction=False) as pipe:
            for request_id in ids:
                event = Event(
                    kind="done" if seq == 4 else "delta",
                    seq=seq,
                    attempt=1,
                    text=f"{request_id}:{seq}",
                )
                pipe.xadd(keys.response(request_id), {"e": event.model_dump_json()})
            await pipe.execute()
        await asyncio.sleep(0.05)
    texts = await asyncio.gather(*readers)
    after = (await redis.info("commandstats")).get("cmdstat_xread", {}).get("calls", 0)
    assert texts == [[f"{request_id}:{seq}" for seq in range(5)] for request_id in ids]
    assert after - before <= 2 * 5  # a read or two a step, not one a stream
    async with asyncio.timeout(GatewayQueue.BLOCK_S + 1.0):  # idle, it stops after its read
        while queue.fanout.reader is not None:
            await asyncio.sleep(0.05)
    await queue.close()
    await redis.aclose()
    await blocking.aclose()


async def test_a_stream_followed_while_the_read_is_blocked_is_served_at_once(
    redis_server: RedisServer,
) -> None:
    """The reader blocks for up to BLOCK_S on the streams it has; a new one must not wait it
    out (its wake stream ends the blocked read)."""
    redis = connect(redis_server.url, timeout_s=2.0)
    blocking = connect(redis_server.url, timeout_s=6.0)
    queue = GatewayQueue(redis, blocking)
    queue.fanout.block_ms = 5000
    quiet = asyncio.create_task(read_all(queue, "fan-quiet"))
    await asyncio.sleep(0.2)  # the reader now blocks on the quiet stream for 5 s
    await write(redis, "fan-late", 0, "done")
    started = time.monotonic()
    assert await read_all(queue, "fan-late") == ["fan-late:0"]
    assert time.monotonic() - started < 1.0
    await write(redis, "fan-quiet", 0, "done")
    assert await quiet == ["fan-quiet:0"]
    await queue.close()
    await redis.aclose()
    await blocking.aclose()


async def test_an_unreachable_redis_reaches_every_follower(tmp_path: Path) -> None:
    """Redis stops while three requests wait: each gets the error (the gateway's 503), and
    once it is back a new request is read by a fresh reader."""
    server = RedisServer(tmp_path)
    try:
        redis = connect(server.url, timeout_s=1.0)
        blocking = connect(server.url, timeout_s=GatewayQueue.BLOCK_S + 1.0)
        queue = GatewayQueue(redis, blocking)
        readers = [asyncio.create_task(read_all(queue, f"fan-down-{i}")) for i in range(3)]
        await asyncio.sleep(0.2)
        server.stop()
        results = await asyncio.gather(*readers, return_exceptions=True)
        assert all(isinstance(r, UNAVAILABLE) for r in results), results
        assert queue.fanout.reader is None
        server.start()
        await write(redis, "fan-back", 0, "done")
        assert await read_all(queue, "fan-back") == ["fan-back:0"]
        await queue.close()
        await redis.aclose()
        await blocking.aclose()
    finally:
        server.stop()


def test_a_malformed_event_fails_only_its_own_request(redis_server: RedisServer) -> None:
    async def run() -> None:
        redis = connect(redis_server.url, timeout_s=2.0)
        blocking = connect(redis_server.url, timeout_s=GatewayQueue.BLOCK_S + 1.0)
        queue = GatewayQueue(redis, blocking)
        good = asyncio.create_task(read_all(queue, "fan-good"))
        bad = asyncio.create_task(read_all(queue, "fan-bad"))
        await asyncio.sleep(0.2)
        await redis.xadd(keys.response("fan-bad"), {"e": "{not json"})
        await write(redis, "fan-good", 0, "done")
        with pytest.raises(ValidationError, match="Invalid JSON"):
            await bad
        assert await good == ["fan-good:0"]
        await queue.close()
        await redis.aclose()
        await blocking.aclose()

    asyncio.run(run())
