"""Cancelling a task that is talking to Redis must stop it: the worker's shutdown, its hand-back
of unfinished requests and the gateway's client disconnects all rely on it. (redis-py 8.0 and
8.1 swallow the cancellation of a command about one time in three; this guards the pin.)"""

import asyncio
import random

from dcoco.queue.connection import connect
from stack import RedisServer


async def test_a_task_cancelled_mid_command_stops(redis_server: RedisServer) -> None:
    redis = connect(redis_server.url, timeout_s=2.0)
    rng = random.Random(0)

    async def busy() -> None:
        while True:
            async with redis.pipeline(transaction=False) as pipe:
                pipe.xadd("cancel-probe", {"e": "x"}, maxlen=100)
                await pipe.execute()
            await redis.get("cancel-probe-key")

    survivors = 0
    for _ in range(150):
        task = asyncio.create_task(busy())
        await asyncio.sleep(rng.random() * 0.004)
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if not done:
            survivors += 1
            task.cancel()
            await asyncio.wait({task}, timeout=1)
    await redis.aclose()
    assert survivors == 0, f"{survivors} of 150 tasks ignored their cancellation"
