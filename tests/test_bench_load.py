"""How a turn of requests goes out: concurrency held at its level, Poisson and gamma arrivals,
and every turn bounded in count and in time."""

import asyncio
import itertools
import random
import statistics
import time

import pytest

from dcoco.bench.load import Load, arrival_times, run_turn
from dcoco.bench.run import level_size, turns


def test_arrivals_are_poisson_at_the_rate_and_gamma_when_bursty() -> None:
    rate = 20.0
    poisson = arrival_times(4000, rate, 1.0, random.Random(1))
    assert len(poisson) == 4000
    assert poisson[0] == 0.0
    assert all(b >= a for a, b in itertools.pairwise(poisson))
    gaps = [b - a for a, b in itertools.pairwise(poisson)]
    assert statistics.mean(gaps) == pytest.approx(1 / rate, rel=0.06)
    # Exponential gaps: the standard deviation equals the mean (coefficient of variation 1).
    assert statistics.stdev(gaps) / statistics.mean(gaps) == pytest.approx(1.0, abs=0.08)
    bursty = arrival_times(4000, rate, 0.25, random.Random(1))
    bursty_gaps = [b - a for a, b in itertools.pairwise(bursty)]
    assert statistics.mean(bursty_gaps) == pytest.approx(1 / rate, rel=0.12)
    assert statistics.stdev(bursty_gaps) / statistics.mean(bursty_gaps) > 1.6  # 1/sqrt(0.25)
    assert arrival_times(5, rate, 1.0, random.Random(7)) == arrival_times(
        5, rate, 1.0, random.Random(7)
    )


async def test_a_rate_turn_stops_sending_when_its_time_budget_runs_out() -> None:
    sent: list[float] = []

    async def send(index: int) -> int:
        sent.append(time.perf_counter())
        await asyncio.sleep(0.05)
        return index

    started = time.perf_counter()
    turn = await run_turn(send, 10_000, Load(rate=100.0), budget_s=0.3, rng=random.Random(0))
    elapsed = time.perf_counter() - started
    assert 10 <= len(turn.results) <= 60  # about 30 arrivals in 0.3 s at 100/s
    assert turn.unsent == 10_000 - len(turn.results)
    assert max(sent) - started < 0.3 + 0.05
    assert elapsed < 1.0
    assert turn.duration_s == pytest.approx(elapsed, abs=0.05)


class Server:
    """A fake server whose requests each take `delay_s`; `most` is the peak in flight."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.in_flight, self.most = delay_s, 0, 0

    async def send(self, index: int) -> int:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(self.delay_s)
        self.in_flight -= 1
        return index


async def test_a_rate_turn_with_a_cap_never_exceeds_it() -> None:
    server = Server(0.05)
    load = Load(concurrency=3, rate=500.0)
    turn = await run_turn(server.send, 30, load, budget_s=5.0, rng=random.Random(0))
    assert len(turn.results) == 30
    assert turn.unsent == 0
    assert server.most == 3


@pytest.mark.parametrize("streams", [1, 4])
async def test_a_concurrency_turn_keeps_exactly_that_many_streams_busy(streams: int) -> None:
    server = Server(0.01)
    turn = await run_turn(server.send, 12, Load(concurrency=streams), 5.0, random.Random(0))
    assert sorted(i for i, _ in turn.results) == list(range(12))
    assert server.most == streams
    assert turn.unsent == 0
    short = await run_turn(server.send, 1000, Load(concurrency=streams), 0.1, random.Random(0))
    assert short.unsent > 0
    assert short.duration_s < 0.5


def test_levels_send_enough_requests_and_split_into_turns() -> None:
    assert level_size(Load(concurrency=1), items=10) == (10, 4)
    assert level_size(Load(concurrency=32), items=10) == (64, 64)  # at least 2 waves
    assert level_size(Load(rate=2.0), items=10) == (10, 10)
    assert [list(r) for r in turns(10, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
