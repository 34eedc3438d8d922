"""How a turn of requests goes out: a fixed number of concurrent streams, each sending its next
request as soon as its last one ends, or arrivals at a mean rate (Poisson, or gamma for burstier
traffic), optionally capped in concurrency.

Every turn is bounded twice: by its number of requests and by a time budget after which no
new request starts (the ones in flight finish, each within its own timeout).
"""

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Load:
    """One level of load: `concurrency` streams, or `rate` requests/s (then `concurrency`, if
    set, caps the requests in flight)."""

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0  # gamma shape of the gaps between arrivals; 1 is Poisson

    @property
    def name(self) -> str:
        return f"r{self.rate:g}" if self.rate is not None else f"c{self.concurrency}"


@dataclass
class Turn(Generic[T]):
    results: list[tuple[int, T]]  # (request index, its result), in completion order
    duration_s: float  # from the first send to the end of the last request
    unsent: int  # requests the time budget left out


def arrival_times(count: int, rate: float, burstiness: float, rng: random.Random) -> list[float]:
    """Offsets in seconds of `count` arrivals whose gaps are gamma(shape=burstiness,
    scale=1 / (rate * burstiness)): mean 1 / rate whatever the burstiness; burstiness 1 is a
    Poisson process, lower is burstier. The first arrival is at 0."""
    offsets, now = [], 0.0
    for i in range(count):
        if i:
            now += rng.gammavariate(burstiness, 1.0 / (rate * burstiness))
        offsets.append(now)
    return offsets


async def run_turn(
    send: Callable[[int], Awaitable[T]],
    count: int,
    load: Load,
    budget_s: float,
    rng: random.Random,
) -> Turn[T]:
    """Sends requests 0..count-1 with `send` under `load`; none starts after `budget_s`."""
    started = time.perf_counter()
    deadline = started + budget_s
    results: list[tuple[int, T]] = []

    async def one(index: int) -> None:
        results.append((index, await send(index)))

    if load.rate is None:
        pending = iter(range(count))

        async def stream() -> None:
            for index in pending:  # shared: each index goes to exactly one stream
                if time.perf_counter() >= deadline:
                    return
                await one(index)

        await asyncio.gather(*(stream() for _ in range(min(load.concurrency or 1, count))))
    else:
        cap = asyncio.Semaphore(load.concurrency or count or 1)

        async def capped(index: int) -> None:
            async with cap:
                await one(index)

        tasks = []
        for index, offset in enumerate(arrival_times(count, load.rate, load.burstiness, rng)):
            if started + offset >= deadline:
                break
            await asyncio.sleep(max(0.0, started + offset - time.perf_counter()))
            tasks.append(asyncio.create_task(capped(index)))
        await asyncio.gather(*tasks)
    return Turn(results, time.perf_counter() - started, count - len(results))
