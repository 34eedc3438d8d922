"""The benchmark run: warm every server up, then, for each mode and each level of load, send
the same requests to every server in turns, interleaved, reading the speculation counters
around each turn.

- Warm-up: first a wait while the server's metrics say its layers are compiling (a torch
  worker compiles them in the background, serving eagerly meanwhile: not its steady state);
  then `warmup` requests per server, sent one at a time and left out of every figure;
  the first also asks for cumulative usage on every chunk (vLLM's `continuous_usage_stats`)
  and, if the server refuses that parameter, the server is asked without it from then on.
- Levels: a level of C streams sends at least MIN_WAVES * C requests (the sample cycled), so
  that C streams are really in flight; servers take turns of TURN_WAVES * C requests, the
  order of the servers rotating from turn to turn, so slow drifts of the machine (other load,
  thermal) fall on all of them alike. A rate level sends the sample once, in one turn each.
- Repeats: the whole sweep runs `repeats` times over, so that each ratio can be read in every
  pass as well as pooled; durations are kept per pass.
- A server whose warm-up fails entirely is left out and reported as failed.
"""

import asyncio
import contextlib
import itertools
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import NoReturn

import aiohttp
from tqdm import tqdm

from dcoco.bench.client import Call, Outcome, Server, stream_chat
from dcoco.bench.load import Load, run_turn
from dcoco.bench.metrics import Record
from dcoco.bench.prompts import Item, Mode, calls
from dcoco.bench.scrape import Counters, ScrapeFailed, compiling, fetch_text, scrape

MIN_WAVES = 2
TURN_WAVES = 4
SCRAPE_TIMEOUT_S = 10.0
COMPILE_WAIT_S = 600.0  # the longest wait for a worker's layers to compile before warming up

Key = tuple[str, str, str]  # (server, mode, level)


@dataclass(frozen=True)
class Plan:
    items: list[Item]
    modes: list[Mode]
    loads: list[Load]
    max_tokens: int
    warmup: int
    timeout_s: float  # per request
    turn_budget_s: float  # no request of a turn starts after this
    seed: int
    repeats: int = 1  # passes over the whole sweep


@dataclass
class Results:
    servers: list[Server]  # the ones measured
    failed: dict[str, str] = field(default_factory=dict)  # server: why it was left out
    records: list[Record] = field(default_factory=list)
    durations: dict[tuple[Key, int], float] = field(default_factory=dict)  # per (key, repeat)
    counters: dict[Key, Counters] = field(default_factory=dict)
    unsent: dict[Key, int] = field(default_factory=dict)
    continuous_usage: dict[str, bool] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def level_size(load: Load, items: int) -> tuple[int, int]:
    """(requests in the level, requests per turn)."""
    if load.rate is not None:
        return items, items
    streams = load.concurrency or 1
    count = max(items, MIN_WAVES * streams)
    return count, min(count, TURN_WAVES * streams)


def turns(count: int, size: int) -> Iterator[range]:
    for start in range(0, count, size):
        yield range(start, min(count, start + size))


async def wait_compiled(http: aiohttp.ClientSession, server: Server, results: Results) -> None:
    """Waits while the server's metrics say its layers are compiling (a torch worker with
    DCOCO_COMPILE), so that its turns measure the steady state; servers without those series
    are not waited for, and one still compiling after COMPILE_WAIT_S is measured as it is."""
    if server.metrics_url is None:
        return
    deadline = time.monotonic() + COMPILE_WAIT_S
    while True:
        try:
            text = await fetch_text(http, server.metrics_url, SCRAPE_TIMEOUT_S)
        except ScrapeFailed:
            return  # the counters' first read reports a broken endpoint
        if not compiling(text):
            return
        if time.monotonic() > deadline:
            results.notes.append(
                f"{server.name}: layers still compiling after {COMPILE_WAIT_S:.0f} s; measured"
                " as they were"
            )
            return
        await asyncio.sleep(1.0)


async def warm_up(
    http: aiohttp.ClientSession, server: Server, plan: Plan, results: Results
) -> bool:
    await wait_compiled(http, server, results)
    mode = plan.modes[0]
    warm = calls(plan.items, plan.warmup, mode, plan.max_tokens, plan.seed)
    probe = await stream_chat(http, server, warm[0], plan.timeout_s, continuous_usage=True)
    results.continuous_usage[server.name] = probe.ok and bool(probe.token_steps)
    outcomes = [probe]
    if not probe.ok and (probe.error or "").startswith("HTTP 400"):
        outcomes = []  # the parameter was refused: warm up without it
    for call in warm[len(outcomes) :]:
        outcomes.append(await stream_chat(http, server, call, plan.timeout_s))
    if not any(o.ok for o in outcomes):
        results.failed[server.name] = f"every warm-up request failed: {outcomes[-1].error}"
        return False
    return True


async def read_counters(
    http: aiohttp.ClientSession, server: Server, results: Results, broken: set[str]
) -> Counters | None:
    """The server's counters now; a failing endpoint is noted once and not asked again."""
    if server.metrics_url is None or server.name in broken:
        return None
    try:
        counters = await scrape(http, server.metrics_url, SCRAPE_TIMEOUT_S, server.speculation)
    except ScrapeFailed as problem:
        broken.add(server.name)
        results.notes.append(f"{server.name}: no speculation counters ({problem})")
        return None
    if counters is None:
        broken.add(server.name)
        results.notes.append(
            f"{server.name}: no speculation counters at {server.metrics_url} (neither "
            "dcoco_spec_* nor vllm:spec_decode_*)"
        )
    return counters


async def run_bench(servers: list[Server], plan: Plan, progress: bool = True) -> Results:
    results = Results(servers=[])
    widest = max([1] + [(load.concurrency or 0) for load in plan.loads] + [len(plan.items)])
    connector = aiohttp.TCPConnector(limit=widest + 8)
    async with aiohttp.ClientSession(connector=connector) as http:
        for server in servers:
            if await warm_up(http, server, plan, results):
                results.servers.append(server)
        total = sum(
            level_size(load, len(plan.items))[0] for load in plan.loads for _ in plan.modes
        ) * (len(results.servers) * plan.repeats)
        bar: tqdm[NoReturn] = tqdm(total=total, unit="req", disable=None if progress else True)
        with contextlib.closing(bar):
            await _measure(http, plan, results, bar)
    return results


async def _measure(
    http: aiohttp.ClientSession, plan: Plan, results: Results, bar: "tqdm[NoReturn]"
) -> None:
    broken: set[str] = set()
    rotation = 0
    for repeat, mode, load in itertools.product(range(plan.repeats), plan.modes, plan.loads):
        count, size = level_size(load, len(plan.items))
        level_calls = calls(plan.items, count, mode, plan.max_tokens, plan.seed)
        for number, chunk in enumerate(turns(count, size)):
            order = results.servers[rotation:] + results.servers[:rotation]
            rotation = (rotation + 1) % max(1, len(results.servers))
            for server in order:
                bar.set_description(f"{mode.name} {load.name} {server.name}")
                key = (server.name, mode.name, load.name)
                before = await read_counters(http, server, results, broken)
                turn_calls = [level_calls[i] for i in chunk]
                rng = random.Random(f"{plan.seed}:{mode.name}:{load.name}:{number}:{repeat}")
                turn = await run_turn(
                    _sender(http, server, turn_calls, plan, results, bar),
                    len(turn_calls),
                    load,
                    plan.turn_budget_s,
                    rng,
                )
                after = await read_counters(http, server, results, broken)
                passed = results.durations.get((key, repeat), 0.0)
                results.durations[(key, repeat)] = passed + turn.duration_s
                results.unsent[key] = results.unsent.get(key, 0) + turn.unsent
                if before is not None and after is not None:
                    delta = after - before
                    results.counters[key] = (
                        results.counters[key] + delta if key in results.counters else delta
                    )
                results.records += [
                    Record(server.name, mode.name, load.name, turn_calls[i].suite, outcome, repeat)
                    for i, outcome in turn.results
                ]
    # An endpoint that failed part-way left some turns uncounted: its deltas would mislead.
    results.counters = {k: v for k, v in results.counters.items() if k[0] not in broken}


def _sender(
    http: aiohttp.ClientSession,
    server: Server,
    turn_calls: list[Call],
    plan: Plan,
    results: Results,
    bar: "tqdm[NoReturn]",
) -> Callable[[int], Awaitable[Outcome]]:
    continuous = results.continuous_usage.get(server.name, False)

    async def send(index: int) -> Outcome:
        outcome = await stream_chat(http, server, turn_calls[index], plan.timeout_s, continuous)
        bar.update(1)
        return outcome

    return send
