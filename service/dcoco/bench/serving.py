"""Gateway and queue overhead: the same engine called in-process and through gateway + Redis,
side by side in one run.

For each engine (the instant fixture, which isolates the overhead, and the real torch engine):
- time to first token of streamed requests sent one at a time (p50, p99), in-process and served;
- sustained throughput of streamed requests with C concurrent clients, in-process and served.
The served stack is the real one: a private redis-server, one `dcoco worker`, one `dcoco
gateway`, and an httpx client in this process. Everything shares this machine's cores.

    python -m dcoco.bench.serving [--requests 200] [--seconds 10] [--concurrency 64]
"""

import argparse
import asyncio
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import aiohttp

from dcoco.paths import TINY_DCOCO, TINY_TARGET
from dcoco.serve import dcoco, free_port, start_redis, stop, wait_ready
from dcoco.settings import WorkerSettings
from dcoco.shared.protocol import EngineClient, EngineRequest
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import Tokenizer
from dcoco.worker.engines import build_engine_client

PROMPT = "def fibonacci(n):"
MODEL = "bench"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def in_process_ttft(
    engine: EngineClient, prompt: list[int], requests: int, max_tokens: int
) -> list[float]:
    """Time to the first token of each request, sent one at a time; each runs to the end."""
    times = []
    for i in range(requests):
        started = time.perf_counter()
        first = 0.0
        async for delta in engine.generate(
            EngineRequest(f"ttft-{i}", prompt, SamplingParams(max_tokens=max_tokens))
        ):
            if delta.token_ids and not first:
                first = time.perf_counter() - started
        times.append(first)
    return times


async def in_process_throughput(
    engine: EngineClient, prompt: list[int], seconds: float, concurrency: int, max_tokens: int
) -> float:
    done = 0
    deadline = time.perf_counter() + seconds

    async def client(c: int) -> None:
        nonlocal done
        i = 0
        while time.perf_counter() < deadline:
            request = EngineRequest(f"tp-{c}-{i}", prompt, SamplingParams(max_tokens=max_tokens))
            async for _ in engine.generate(request):
                pass
            done += 1
            i += 1

    started = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(concurrency)))
    return done / (time.perf_counter() - started)


async def served_stream(http: aiohttp.ClientSession, url: str, max_tokens: int) -> float:
    """One streamed chat request; returns the time to its first content chunk."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first = 0.0
    async with http.post(f"{url}/v1/chat/completions", json=body) as reply:
        reply.raise_for_status()
        async for line in reply.content:
            if (
                not first
                and line.startswith(b"data: {")
                and b'"content":"' in line
                and b'"content":""' not in line
            ):
                first = time.perf_counter() - started
    return first


def session(concurrency: int) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=concurrency)
    return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60))


async def served_ttft(url: str, requests: int, max_tokens: int) -> list[float]:
    async with session(1) as http:
        return [await served_stream(http, url, max_tokens) for _ in range(requests)]


async def served_throughput(url: str, seconds: float, concurrency: int, max_tokens: int) -> float:
    async with session(concurrency) as http:
        done = 0
        deadline = time.perf_counter() + seconds

        async def client() -> None:
            nonlocal done
            while time.perf_counter() < deadline:
                await served_stream(http, url, max_tokens)
                done += 1

        started = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        return done / (time.perf_counter() - started)


async def cancel_latency(url: str, metrics_url: str, requests: int) -> float:
    """Mean seconds from a client's disconnect (as the gateway saw it) to the engine abort,
    from the worker's dcoco_cancel_latency_seconds, over requests dropped after two chunks."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1000}
    async with session(1) as http:
        for _ in range(requests):
            async with http.post(
                f"{url}/v1/chat/completions", json=body | {"stream": True}
            ) as reply:
                await reply.content.readline()
                await reply.content.readline()
            await asyncio.sleep(0.2)  # let the abort land before the next request
        async with http.get(metrics_url) as reply:
            text = await reply.text()
    values = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line.startswith("dcoco_cancel")
    )
    total = float(values[f'dcoco_cancel_latency_seconds_sum{{model="{MODEL}"}}'])
    count = float(values[f'dcoco_cancel_latency_seconds_count{{model="{MODEL}"}}'])
    return total / count if count else float("nan")


def served_stack(env: dict[str, str], folder: Path) -> tuple[str, list[subprocess.Popen[bytes]]]:
    redis_port, port = free_port(), free_port()
    redis = start_redis(redis_port, folder)
    env = (
        dict(os.environ)
        | env
        | {
            "DCOCO_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "DCOCO_PORT": str(port),
            "DCOCO_MODEL_NAME": MODEL,
            "DCOCO_LOG_LEVEL": "warning",
            "DCOCO_MAX_QUEUE_DEPTH": "100000",
        }
    )
    children = [dcoco("gateway", env), dcoco("worker", env), redis]
    url = f"http://127.0.0.1:{port}"
    if not wait_ready([f"{url}/readyz"], children, lambda: False):
        raise RuntimeError("the served stack did not start")
    return url, children


async def measure(engine_name: str, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    env = {
        "DCOCO_ENGINE": engine_name,
        "DCOCO_TARGET": str(args.target),
        "DCOCO_DRAFTER": str(args.drafter),
        "DCOCO_MAX_BATCH_SIZE": str(args.concurrency),
        "DCOCO_METRICS_PORT": str(free_port()),
    }
    settings = WorkerSettings(**{k.removeprefix("DCOCO_").lower(): v for k, v in env.items()})  # type: ignore[arg-type]
    tokenizer = Tokenizer.from_dir(settings.target)
    prompt = tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": PROMPT}]))
    engine = build_engine_client(settings, tokenizer)
    await in_process_ttft(engine, prompt, 5, args.max_tokens)  # warm up
    local_ttft = await in_process_ttft(engine, prompt, args.requests, args.max_tokens)
    local_rate = await in_process_throughput(
        engine, prompt, args.seconds, args.concurrency, args.max_tokens
    )
    await engine.close()
    url, children = served_stack(env, folder)
    try:
        await served_ttft(url, 5, args.max_tokens)  # warm up
        remote_ttft = await served_ttft(url, args.requests, args.max_tokens)
        remote_rate = await served_throughput(url, args.seconds, args.concurrency, args.max_tokens)
        metrics_url = f"http://127.0.0.1:{env['DCOCO_METRICS_PORT']}/metrics"
        cancel = await cancel_latency(url, metrics_url, 20)
    finally:
        stop(children, drain_s=5)
    return {
        "local_ttft_p50": percentile(local_ttft, 0.5),
        "local_ttft_p99": percentile(local_ttft, 0.99),
        "served_ttft_p50": percentile(remote_ttft, 0.5),
        "served_ttft_p99": percentile(remote_ttft, 0.99),
        "local_rps": local_rate,
        "served_rps": remote_rate,
        "cancel_s": cancel,
    }


COLUMNS = [
    ("TTFT p50 in-process", "local_ttft_p50"),
    ("TTFT p50 served", "served_ttft_p50"),
    ("TTFT p99 in-process", "local_ttft_p99"),
    ("TTFT p99 served", "served_ttft_p99"),
]


def table(results: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    header = ["engine", *(name for name, _ in COLUMNS), "added p50", "added p99"]
    header += ["req/s in-process", "req/s served", "served / in-process", "disconnect to abort"]
    rows = [
        "# Gateway and queue overhead",
        "",
        "Generated by `make bench-serving`.",
        "",
        f"Streamed chat requests of {args.max_tokens} tokens. TTFT: {args.requests} requests, one "
        f"at a time. Throughput: {args.concurrency} concurrent clients for {args.seconds:.0f} s. "
        "Served: aiohttp client, gateway, Redis, worker, engine and back. In-process: the same "
        "engine client called directly. Everything, the client included, shares 2 cores.",
        "",
        "| " + " | ".join(header) + " |",
        "|---" + "|---:" * (len(header) - 1) + "|",
    ]
    for name, r in results.items():
        cells = [name, *(f"{r[key] * 1000:.2f} ms" for _, key in COLUMNS)]
        cells += [
            f"{(r[f'served_ttft_{q}'] - r[f'local_ttft_{q}']) * 1000:.2f} ms"
            for q in ("p50", "p99")
        ]
        cells += [
            f"{r['local_rps']:.0f}",
            f"{r['served_rps']:.0f}",
            f"{r['served_rps'] / r['local_rps']:.2f}",
            f"{r['cancel_s'] * 1000:.1f} ms",
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--engines", nargs="+", default=["instant", "torch"], choices=["instant", "torch"]
    )
    parser.add_argument("--target", type=Path, default=TINY_TARGET)
    parser.add_argument("--drafter", type=Path, default=TINY_DCOCO)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as folder:
        for engine in args.engines:
            results[engine] = asyncio.run(measure(engine, args, Path(folder)))
            print(
                engine, json.dumps({k: round(v, 5) for k, v in results[engine].items()}), flush=True
            )
    text = table(results, args)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
