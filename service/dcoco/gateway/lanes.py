"""Where request bodies are parsed, rendered and tokenized: off the event loop, in two lanes.

A body of up to `large_body_bytes` takes the small lane, a pool of `tokenizer_threads` threads.
A larger one takes the large lane: `large_body_threads` at a time for the whole gateway, and one
at a time for each key (a principal; every caller is one key when authentication is off). Large
bodies therefore queue among themselves, in arrival order, and never hold a thread a small
request is waiting for; and one key's flood of large bodies waits behind its own first one, not
in front of other keys'.

The lanes bound how much of this work is in flight, not how long it takes: each request's share
is bounded where it is done (the size limit on bodies, the token bound before tokenizing).
"""

import functools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import anyio

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True)
class Lane:
    threads: anyio.CapacityLimiter

    async def run(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Runs CPU-bound request work on one of this lane's threads."""
        call = functools.partial(work, *args, **kwargs)
        return await anyio.to_thread.run_sync(call, limiter=self.threads)


class Lanes:
    def __init__(self, small_threads: int, large_threads: int, large_body_bytes: int) -> None:
        self.small = Lane(anyio.CapacityLimiter(small_threads))
        self.large = Lane(anyio.CapacityLimiter(large_threads))
        self.large_slots = anyio.Semaphore(large_threads)
        self.large_body_bytes = large_body_bytes
        self.per_key: dict[str, anyio.Lock] = {}  # only keys with a large body in the lane

    @asynccontextmanager
    async def enter(self, principal: str, body_bytes: int) -> AsyncIterator[Lane]:
        """The lane for a body of `body_bytes` from `principal`, held until the block ends."""
        if body_bytes <= self.large_body_bytes:
            yield self.small
            return
        lock = self.per_key.setdefault(principal, anyio.Lock())
        try:
            async with lock, self.large_slots:
                yield self.large
        finally:
            if not lock.locked() and not lock.statistics().tasks_waiting:
                self.per_key.pop(principal, None)
