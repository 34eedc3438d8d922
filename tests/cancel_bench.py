"""The cancel path under load: from a client's disconnect to the engine's abort.

A stack (redis-server, one worker, one gateway) serves the embedded tiny pair, once its worker
has compiled its layers. `--load` streams generate all along; meanwhile `--cancels` streams are
opened one after another, each read until it is generating, then cut by closing its connection.
The latency of one cancel runs from the moment the client closed its socket to the moment the
worker, having aborted the engine request, wrote the request's `cancelled` event: the time in
that event's stream entry id (Redis's clock, the same machine's). It covers the gateway noticing
the disconnect, the cancel flag and its notice, the worker hearing it, the abort between two
engine cycles, and the write. The "flag" column is the first part alone: from the close to the
cancel flag the gateway set. The last column is the full garbage collections of the worker and
of the gateway while the cancels ran, each a pause of the whole process
(`dcoco_gc_full_collection_seconds`). A stream that ended on its own before its cancel arrived
(a short answer) is counted apart.

    .venv/bin/python tests/cancel_bench.py [--load 8] [--cancels 100] [--out docs/cancel.md]

Not collected by pytest. Exit status 1 if a cancel was never seen.
"""

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from dcoco.paths import TINY_DCOCO, TINY_TARGET
from dcoco.queue import keys
from fault_trials import machine
from stack import Stack, fetch, metric_values, wait_for

ENV = {"DCOCO_MAX_MODEL_LEN": "1024", "DCOCO_PRECISION": "bf16", "DCOCO_ADAPTIVE": "true"}
SEEN_TIMEOUT_S = 10.0  # a cancel not written by then counts as never seen


def chat(prompt: str, max_tokens: int) -> dict[str, object]:
    messages = [{"role": "user", "content": prompt}]
    return {"model": Stack.MODEL, "messages": messages, "max_tokens": max_tokens, "stream": True}


async def keep_generating(client: httpx.AsyncClient, prompt: str, stop: asyncio.Event) -> None:
    """One stream of load, started again each time it ends, until `stop`."""
    while not stop.is_set():
        async with client.stream("POST", "/v1/chat/completions", json=chat(prompt, 900)) as r:
            async for _ in r.aiter_lines():
                if stop.is_set():
                    break


async def cut_one(url: str, prompt: str) -> tuple[str, float]:
    """Opens a stream, reads it until it is generating, closes the connection; returns the
    response id and the time of the close (unix seconds)."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        reply_cm = client.stream("POST", "/v1/chat/completions", json=chat(prompt, 900))
        reply = await reply_cm.__aenter__()
        contents = 0
        response_id = ""
        async for line in reply.aiter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line.removeprefix("data: "))
                response_id = chunk["id"]
                contents += bool(chunk["choices"] and chunk["choices"][0]["delta"].get("content"))
            if contents >= 2:
                break
        closed_at = time.time()
        await reply_cm.__aexit__(None, None, None)  # closes the connection mid-stream
    return response_id, closed_at


def flagged_at(stack: Stack, response_id: str) -> float | None:
    """When the gateway set the request's cancel flag (its value), if it did."""
    value = stack.redis.client().get(keys.cancel(f"{response_id}-0"))
    return None if value is None else float(value)


def ended_at(stack: Stack, response_id: str) -> tuple[str, float] | None:
    """How and when (Redis's clock) the request ended: "cancelled" when the worker wrote its
    `cancelled` event, "finished" when it ended on its own first (a short answer); None while
    it has not ended."""
    for entry_id, fields in stack.redis.client().xrange(keys.response(f"{response_id}-0")):
        event = json.loads(fields["e"])
        at = int(entry_id.split("-")[0]) / 1000
        if event.get("kind") == "error" and event["error"]["code"] == "cancelled":
            return "cancelled", at
        if event.get("kind") == "done":
            return "finished", at
    return None


@dataclass
class Cut:
    """One cancel, in seconds from the client's close."""

    flag: float | None  # to the cancel flag
    abort: float | None  # to the abort; None if never seen, or if it finished first
    finished_first: bool = False


async def measure(stack: Stack, load: int, cancels: int) -> list[Cut]:
    """Each cancel's latencies; None for what was never seen."""
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=load + 2)
    async with httpx.AsyncClient(base_url=stack.url, timeout=60, limits=limits) as client:
        streams = [
            asyncio.create_task(keep_generating(client, f"def load_{i}(x):", stop))
            for i in range(load)
        ]
        await asyncio.sleep(2.0 if load else 0.0)  # the load is generating
        cuts = []
        for i in range(cancels):
            cuts.append(await cut_one(stack.url, f"def cut_{i}(values):"))
            await asyncio.sleep(0.05)
        stop.set()
        for task in streams:
            task.cancel()
        await asyncio.gather(*streams, return_exceptions=True)
    deadline = time.monotonic() + SEEN_TIMEOUT_S
    latencies: list[Cut] = []
    for response_id, closed in cuts:
        ended = ended_at(stack, response_id)
        while ended is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
            ended = ended_at(stack, response_id)
        flagged = flagged_at(stack, response_id)
        flag = None if flagged is None else flagged - closed
        if ended is None:
            describe_unseen(stack, response_id, closed, flagged)
            latencies.append(Cut(flag, None))
        else:
            how, at = ended
            latencies.append(
                Cut(flag, at - closed if how == "cancelled" else None, how != "cancelled")
            )
    return latencies


def describe_unseen(stack: Stack, response_id: str, closed: float, flagged: float | None) -> None:
    """What became of a request whose abort was never seen, on stderr."""
    entries = stack.redis.client().xrange(keys.response(f"{response_id}-0"))
    events = [json.loads(fields["e"]) for _, fields in entries]
    detail = {
        "response": response_id,
        "flag_after_s": None if flagged is None else round(flagged - closed, 3),
        "events": len(events),
        "last": [(e["kind"], e.get("finish_reason"), e.get("error")) for e in events[-3:]],
        "last_at_s": round(int(entries[-1][0].split("-")[0]) / 1000 - closed, 3)
        if entries
        else None,
    }
    print(json.dumps(detail), file=sys.stderr, flush=True)


def quantiles(values: list[float]) -> list[float]:
    """p50, p90, p99 and max, in milliseconds (p99 is the largest below the top 1%)."""
    ordered = sorted(values)
    picks = [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.9, 0.99)]
    return [1000 * v for v in (statistics.median(ordered), *picks, ordered[-1])]


def worker_metrics(stack: Stack) -> dict[str, float]:
    return metric_values(httpx.get(f"http://127.0.0.1:{stack.metrics_ports[0]}/metrics").text)


def wait_compiled(stack: Stack) -> None:
    wait_for(lambda: compiled(worker_metrics(stack)), 600, "the worker's compiles")


def compiled(series: dict[str, float]) -> bool:
    """Whether every compile of the worker's layers has ended (ready or failed)."""
    planned = "dcoco_engine_compiled_shapes{"
    for name, value in series.items():
        if name.startswith(planned) and 'state="planned"' in name:
            ready = series[name.replace('state="planned"', 'state="ready"')]
            failed = name.replace(planned, "dcoco_engine_compile_failed{").replace(
                ',state="planned"', ""
            )
            if ready < value and not series.get(failed):
                return False
    return True


def collections(before: dict[str, float], after: dict[str, float]) -> str:
    """Full garbage collections between two scrapes of a process: how many, and their ms."""
    name = "dcoco_gc_full_collection_seconds"
    count = after[f"{name}_count"] - before[f"{name}_count"]
    return f"{count:g} / {1000 * (after[f'{name}_sum'] - before[f'{name}_sum']):.0f}"


def summary(latencies: list[Cut], load: int, collections: str) -> str:
    flags = [c.flag for c in latencies if c.flag is not None and not c.finished_first]
    aborts = [c.abort for c in latencies if c.abort is not None]
    finished = sum(c.finished_first for c in latencies)
    if not aborts:
        return f"| {load} | {len(latencies)} | {finished} | 0 | | | | | | {collections} |"
    p50, p90, p99, worst = quantiles(aborts)
    flag = quantiles(flags)[2] if flags else float("nan")
    return (
        f"| {load} | {len(latencies)} | {finished} | {len(aborts)} | {p50:.0f} | {p90:.0f} | "
        f"{p99:.0f} | {worst:.0f} | {flag:.0f} | {collections} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--load", type=int, nargs="+", default=[0, 8], help="streams of load")
    parser.add_argument("--cancels", type=int, default=100)
    parser.add_argument("--out", type=Path, help="write the table here (Markdown)")
    args = parser.parse_args()
    rows = [
        "| load streams | cancels | finished first | aborted | p50 ms | p90 ms | p99 ms | max ms "
        "| flag p99 ms | full collections, worker; gateway: count / ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    missing = 0
    with tempfile.TemporaryDirectory(prefix="dcoco-cancel-") as scratch:
        for load in args.load:
            folder = Path(scratch) / f"load-{load}"
            folder.mkdir()
            stack = Stack(folder, {"target": TINY_TARGET, "dcoco": TINY_DCOCO}, **ENV)
            try:
                stack.start()
                wait_compiled(stack)
                started = worker_metrics(stack), metric_values(fetch(f"{stack.url}/metrics"))
                latencies = asyncio.run(measure(stack, load, args.cancels))
                histogram = worker_metrics(stack)
                gateway = metric_values(fetch(f"{stack.url}/metrics"))
            finally:
                stack.stop()
            missing += sum(1 for c in latencies if c.abort is None and not c.finished_first)
            paused = f"{collections(started[0], histogram)}; {collections(started[1], gateway)}"
            rows.append(summary(latencies, load, paused))
            count = histogram.get(f'dcoco_cancel_latency_seconds_count{{model="{Stack.MODEL}"}}')
            print(rows[-1], f"(worker histogram: {count:g} aborts)", flush=True)
    report = "\n".join(rows)
    print(report)
    if args.out is not None:
        args.out.write_text(
            "# The cancel path under load\n\n"
            f"{__doc__.split(chr(10) + chr(10))[1]}\n\n"
            f"```\n.venv/bin/python {' '.join(sys.argv)}\n```\n\n"
            f"Machine: {machine()}; load average {os.getloadavg()[0]:.1f} at the end.\n\n"
            f"{report}\n"
        )
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
