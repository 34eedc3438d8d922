"""The lanes request bodies are parsed and tokenized in: large bodies wait for each other, one
key's at a time, and never for the small lane."""

import time

import anyio

from dcoco.gateway.lanes import Lanes

SMALL, LARGE = 100, 10_000


async def test_large_bodies_wait_in_their_own_lane_and_small_ones_do_not() -> None:
    lanes = Lanes(small_threads=2, large_threads=1, large_body_bytes=1000)
    order: list[str] = []

    async def work(name: str, principal: str, size: int, seconds: float) -> None:
        async with lanes.enter(principal, size) as lane:
            order.append(f"{name} started")
            await lane.run(time.sleep, seconds)

    async with anyio.create_task_group() as group:
        for i in range(3):
            group.start_soon(work, f"large{i}", "a", LARGE, 0.2)
            await anyio.sleep(0.01)  # arrival order
        started = time.monotonic()
        await work("small", "a", SMALL, 0.0)
        small_took = time.monotonic() - started
    assert small_took < 0.1  # it never waited for the large lane
    assert order.index("small started") < order.index("large1 started")
    assert [o for o in order if o.startswith("large")] == [f"large{i} started" for i in range(3)]
    assert not lanes.per_key  # nothing left behind


async def test_one_key_s_large_bodies_do_not_queue_in_front_of_another_key_s() -> None:
    lanes = Lanes(small_threads=1, large_threads=2, large_body_bytes=1000)
    order: list[str] = []

    async def work(name: str, principal: str) -> None:
        async with lanes.enter(principal, LARGE) as lane:
            order.append(name)
            await lane.run(time.sleep, 0.1)

    async with anyio.create_task_group() as group:
        for i in range(4):
            group.start_soon(work, f"a{i}", "a")
            await anyio.sleep(0.01)
        group.start_soon(work, "b0", "b")
    # a0 holds key a's turn; b0 takes the second large slot before a1, a2 and a3.
    assert order[:2] == ["a0", "b0"]
    assert order[2:] == ["a1", "a2", "a3"]
