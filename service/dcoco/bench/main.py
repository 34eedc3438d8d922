"""`dcoco bench` from its parsed arguments: check the servers, sample the suites, run, report."""

import argparse
import asyncio
import datetime
import os
import platform
import shlex
import sys
from dataclasses import dataclass, replace
from typing import Any

import aiohttp

from dcoco.bench.check import base_url, resolve
from dcoco.bench.client import Server
from dcoco.bench.load import Load
from dcoco.bench.markdown import summary
from dcoco.bench.prompts import Item, load_suites, modes, sample
from dcoco.bench.report import build, write
from dcoco.bench.run import MIN_WAVES, TURN_WAVES, Plan, run_bench
from dcoco.shared.errors import UsageError


@dataclass(frozen=True)
class Endpoint:
    """A server as the user named it, not yet checked."""

    name: str
    url: str
    metrics_url: str | None  # None: the server's own /metrics


def endpoints(args: argparse.Namespace) -> list[Endpoint]:
    """--url (as --name) and every --baseline NAME=URL, with their metrics URLs."""
    metrics: dict[str, str | None] = dict(
        _pair(text, "--baseline-metrics") for text in args.baseline_metrics
    )
    named = [(args.name, args.url)] + [_pair(text, "--baseline") for text in args.baseline]
    names = [name for name, _ in named]
    if len(set(names)) != len(names):
        raise UsageError(f"server names must differ: {', '.join(names)}")
    unknown = set(metrics) - set(names)
    if unknown:
        raise UsageError(f"--baseline-metrics names no server: {', '.join(sorted(unknown))}")
    metrics[args.name] = args.metrics_url or metrics.get(args.name)
    found = []
    for name, url in named:
        base = base_url(url, "--url" if name == args.name else f"--baseline {name}")
        where = metrics.get(name)
        found.append(Endpoint(name, base, base_url(where, "metrics URL") if where else None))
    return found


def _pair(text: str, flag: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise UsageError(f"{flag} {text!r}: expected NAME=URL")
    return name.strip(), value.strip()


def loads(args: argparse.Namespace) -> list[Load]:
    if args.request_rate:
        return [Load(args.max_concurrency, rate, args.burstiness) for rate in args.request_rate]
    return [Load(concurrency) for concurrency in args.concurrency]


async def check_all(found: list[Endpoint], model: str | None) -> list[Server]:
    async with aiohttp.ClientSession() as http:
        return [
            await resolve(http, e.name, e.url, model, e.metrics_url or f"{e.url}/metrics")
            for e in found
        ]


def setup_text(args: argparse.Namespace, items: list[Item], sources: dict[str, str]) -> str:
    counts = {name: sum(item.suite == name for item in items) for name in sources}
    suites = "; ".join(f"{name} ({counts[name]}, {source})" for name, source in sources.items())
    levels = ", ".join(load.name for load in loads(args))
    return (
        f"{len(items)} prompts, sampled with seed {args.seed}, at most {args.limit} per suite: "
        f"{suites}. Modes: {', '.join(args.modes)}; loads: {levels} (cN: N concurrent "
        f"streams, at least {MIN_WAVES}N requests, the sample cycled; rN: Poisson-like arrivals "
        f"at N requests/s, burstiness {args.burstiness:g}). Up to {args.max_tokens} output "
        f"tokens per request, {args.warmup} warm-up requests per server left out. The servers "
        f"take turns of {TURN_WAVES}N requests in rotating order, so every server meets the same "
        f"machine load. Client and servers: {platform.platform()}, {os.cpu_count()} CPUs."
    )


def measure(
    args: argparse.Namespace,
    servers: list[Server],
    baselines: list[str],
    failed: dict[str, str],
    notes: list[str],
) -> dict[str, Any]:
    """Runs the plan against checked servers, writes the report, returns it. `baselines`: the
    servers a ratio may be taken against when none is named vanilla, the first first."""
    suites = load_suites(args.suites, args.prompts, args.heldout)
    items = sample(suites, args.limit, args.seed)
    plan = Plan(
        items=items,
        modes=modes(args.modes, args.thinking),
        loads=loads(args),
        max_tokens=args.max_tokens,
        warmup=args.warmup,
        timeout_s=args.request_timeout,
        turn_budget_s=args.turn_budget,
        seed=args.seed,
        repeats=args.repeats,
    )
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    results = asyncio.run(run_bench(servers, plan, progress=not args.no_progress))
    results.failed = failed | results.failed
    results.notes += notes
    if not results.servers:
        reasons = "; ".join(f"{name}: {why}" for name, why in results.failed.items())
        raise UsageError(f"no server could be measured ({reasons})")
    context = {
        "command": (
            "dcoco bench " + shlex.join(sys.argv[2:])
            if sys.argv[1:2] == ["bench"]
            else "dcoco bench"
        ),
        "started": started,
        "setup": setup_text(args, items, {s.name: s.source for s in suites}),
        "suites": {s.name: s.source for s in suites},
    }
    report = build(results, plan, context, args.slo, args.block_size, baselines)
    print(summary(report))
    for path in write(report, args.out):
        print(f"wrote {path}")
    return report


def variants(servers: list[Server], methods: list[str]) -> list[Server]:
    """The --url server once per speculation method, each named by its method; the baselines
    after them."""
    first, rest = servers[0], servers[1:]
    taken = {s.name for s in rest} & set(methods)
    if taken:
        raise UsageError(f"--speculation names a --baseline already has: {', '.join(taken)}")
    return [replace(first, name=method, speculation=method) for method in methods] + rest


def run_bench_command(args: argparse.Namespace) -> None:
    found = endpoints(args)
    servers = asyncio.run(check_all(found, args.model))
    baselines = [e.name for e in found[1:]]
    if args.speculation:
        servers = variants(servers, args.speculation)
        # Plain decoding is the reference when it runs, as `vanilla` is between servers.
        baselines = ["off", *baselines] if "off" in args.speculation else baselines
    measure(args, servers, baselines, {}, [])
