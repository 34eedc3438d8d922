"""Fault trials (`make faults`): each fault kind of tests/fault_kinds.py, repeated at load and
counted.

Each trial starts a fresh stack (redis-server, two workers, one gateway or two; the small test
models from `factories.write_models`, or the embedded tiny pair for vLLM), opens N concurrent
streams with distinct prompts, waits until every stream is generating, applies the kind's fault
and follows every stream to its end. Each stream ends as one of OUTCOMES; the reference is each
prompt's answer to one non-streamed request on an idle stack (the same vLLM stack, before the
fault, for vllm-kill).

    .venv/bin/python tests/fault_trials.py [--kinds kill drain ...] [--trials 3] [--streams 32]
        [--out docs/faults.md]

It lives beside the test helpers it drives (stack.py, factories.py) and is not collected by
pytest (its name does not start with test_). Exit status 1 if any stream was different, hung
or lost.
"""

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import torch

from dcoco.serve import redis_server_binary
from factories import write_models
from fault_kinds import KINDS, Kind, Scene, build_stack, start
from stack import Stack

OUTCOMES = {
    "identical": "finished ([DONE] and a finish reason) with the single-request reference's text",
    "complete": "finished with max_tokens tokens, or fewer ending at an end-of-text token, where "
    "no text is promised (unseeded)",
    "different": "finished with other text (tokens lost, repeated or crossed between streams), "
    "or, unseeded, with another number of tokens",
    "error": "ended with an explicit error, as an HTTP status or an error event",
    "cut": "its connection went down with the gateway it went through, which was killed",
    "hung": "still open when the trial's time limit passed",
    "lost": "ended without a finish reason and without an error (a cut connection)",
}
BAD = ("different", "hung", "lost")
STARTED_TIMEOUT_S = 60.0  # every stream generating, or the trial is void
ENV = {
    "DCOCO_MODE": "vanilla",  # one token per step keeps the fault mid-generation
    "DCOCO_MAX_MODEL_LEN": "4096",
    "DCOCO_LEASE_S": "2",
    "DCOCO_STALL_TIMEOUT_S": "30",
}
VLLM_STREAMS, VLLM_MAX_TOKENS = 8, 400  # the tiny pair's context is 512 in the stack


@dataclass
class Stream:
    prompt: str
    via: str  # the gateway's base URL
    text: str = ""
    response_id: str | None = None
    finish: str | None = None
    completion_tokens: int | None = None
    error: str | None = None
    done: bool = False  # [DONE] arrived
    generating: asyncio.Event = field(default_factory=asyncio.Event)

    def outcome(self, reference: str | None, hung: bool, cut_gateway: str | None, want: int) -> str:
        if hung:
            return "hung"
        if self.error is not None:
            return "error"
        if not self.done or self.finish is None:
            return "cut" if self.via == cut_gateway else "lost"
        if reference is None:  # all the tokens asked for, or fewer up to an end of text
            stopped = self.finish == "stop" and (self.completion_tokens or 0) <= want
            full = self.finish == "length" and self.completion_tokens == want
            return "complete" if stopped or full else "different"
        return "identical" if self.text == reference else "different"


def body(
    prompt: str, max_tokens: int, stream: bool, sampling: dict[str, object]
) -> dict[str, object]:
    messages = [{"role": "user", "content": prompt}]
    request = {"model": Stack.MODEL, "messages": messages, "max_tokens": max_tokens}
    if stream:
        request |= {"stream": True, "stream_options": {"include_usage": True}}
    return request | sampling


async def follow(
    client: httpx.AsyncClient, stream: Stream, max_tokens: int, sampling: dict[str, object]
) -> None:
    request = body(stream.prompt, max_tokens, True, sampling)
    try:
        async with client.stream("POST", "/v1/chat/completions", json=request) as reply:
            if reply.status_code != 200:
                stream.error = f"HTTP {reply.status_code}"
                return
            async for line in reply.aiter_lines():
                if not line.startswith("data: "):
                    continue  # keep-alives and event separators
                if line == "data: [DONE]":
                    stream.done = True
                    return
                chunk = json.loads(line.removeprefix("data: "))
                if "error" in chunk:
                    stream.error = str(chunk["error"]["code"])
                    continue
                stream.response_id = chunk["id"]
                if chunk.get("usage"):
                    stream.completion_tokens = chunk["usage"]["completion_tokens"]
                for choice in chunk["choices"]:
                    stream.text += choice["delta"].get("content") or ""
                    stream.finish = choice["finish_reason"] or stream.finish
                if stream.text:
                    stream.generating.set()
    except httpx.HTTPError:
        return  # neither finished nor an explicit error: lost, or cut with its gateway


@dataclass
class Trial:
    hit: int  # streams the fault hit: held by the worker, or through the gateway
    outcomes: Counter[str]
    seconds: float


async def run_trial(
    kind: Kind,
    scene: Scene,
    prompts: list[str],
    references: list[str | None],
    args: argparse.Namespace,
) -> Trial:
    started = time.monotonic()
    streams = [Stream(p, scene.gateways[i % len(scene.gateways)]) for i, p in enumerate(prompts)]
    timeout = httpx.Timeout(args.trial_timeout, connect=5.0)
    limits = httpx.Limits(max_connections=len(streams) + 4)
    clients = {
        url: httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits)
        for url in scene.gateways
    }
    try:
        tasks = [
            asyncio.create_task(follow(clients[s.via], s, args.max_tokens, kind.sampling(i)))
            for i, s in enumerate(streams)
        ]
        waiting = [asyncio.create_task(s.generating.wait()) for s in streams]
        _, not_yet = await asyncio.wait(waiting, timeout=STARTED_TIMEOUT_S)
        for late in not_yet:
            late.cancel()
        scene.response_ids = [s.response_id for s in streams]
        hit = await kind.disturb(scene)
        _, pending = await asyncio.wait(tasks, timeout=args.trial_timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        for client in clients.values():
            await client.aclose()
    outcomes: Counter[str] = Counter()
    for s, ref, t in zip(streams, references, tasks, strict=True):
        outcome = s.outcome(ref, t in pending, scene.killed_gateway, args.max_tokens)
        outcomes[outcome] += 1
        if outcome in BAD:
            report_bad(s, ref, outcome, s.response_id in scene.hit_ids)
    return Trial(hit, outcomes, time.monotonic() - started)


def report_bad(stream: Stream, reference: str | None, outcome: str, hit: bool) -> None:
    """What a failing stream received, against its reference, on stderr."""
    agree = 0
    if reference is not None:
        while agree < min(len(stream.text), len(reference)):
            if stream.text[agree] != reference[agree]:
                break
            agree += 1
    detail = {
        "outcome": outcome,
        "response": stream.response_id,
        "hit": hit,  # held by the disturbed worker, or through the killed gateway
        "finish": stream.finish,
        "completion_tokens": stream.completion_tokens,
        "chars": len(stream.text),
        "reference_chars": None if reference is None else len(reference),
        "first_difference": agree,
        "received_there": stream.text[agree : agree + 40],
        "reference_there": None if reference is None else reference[agree : agree + 40],
    }
    print(json.dumps(detail), file=sys.stderr, flush=True)


async def reference_answers(
    url: str, prompts: list[str], max_tokens: int, kind: Kind
) -> list[str | None]:
    """Each prompt alone on an idle stack, one non-streamed request at a time; None for each
    where the kind promises no text (unseeded sampling)."""
    if not kind.compares:
        return [None] * len(prompts)
    answers: list[str | None] = []
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        for i, prompt in enumerate(prompts):
            request = body(prompt, max_tokens, False, kind.sampling(i))
            reply = await client.post("/v1/chat/completions", json=request)
            reply.raise_for_status()
            answers.append(reply.json()["choices"][0]["message"]["content"])
    return answers


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip()
            for line in cpuinfo.read_text().splitlines()
            if line.startswith("model name")
        ]
        cpu = names[0] if names else cpu
    version = [redis_server_binary(), "--version"]
    redis = subprocess.run(version, capture_output=True, text=True, check=False).stdout.split()[2]
    return (
        f"{cpu}, {os.cpu_count()} cores (shared with other jobs), {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}, torch {torch.__version__}, "
        f"Redis {redis.removeprefix('v=')}"
    )


def trial_table(trials: list[Trial]) -> str:
    head = f"| trial | streams hit | {' | '.join(OUTCOMES)} | seconds |"
    rows = [head, "|" + "---:|" * (len(OUTCOMES) + 3)]
    for number, t in enumerate(trials, 1):
        counts = " | ".join(str(t.outcomes[o]) for o in OUTCOMES)
        rows.append(f"| {number} | {t.hit} | {counts} | {t.seconds:.1f} |")
    rows.append(summary_row("all", trials, bold=True))
    return "\n".join(rows)


def summary_row(name: str, trials: list[Trial], bold: bool = False) -> str:
    total = Counter[str]()
    for t in trials:
        total.update(t.outcomes)
    mark = "**" if bold else ""
    counts = " | ".join(f"{mark}{total[o]}{mark}" for o in OUTCOMES)
    seconds = sum(t.seconds for t in trials)
    return f"| {name} | {sum(t.hit for t in trials)} | {counts} | {seconds:.1f} |"


def summary_table(results: dict[str, list[Trial]]) -> str:
    head = f"| kind | trials | streams hit | {' | '.join(OUTCOMES)} | seconds |"
    rows = [head, "|---|" + "---:|" * (len(OUTCOMES) + 3)]
    for name, trials in results.items():
        row = summary_row(name, trials).split(" | ", 1)[1]
        rows.append(f"| {name} | {len(trials)} | {row}")
    return "\n".join(rows)


def run_kind(
    kind: Kind,
    root: Path,
    models: dict[str, Path],
    args: argparse.Namespace,
    cache: dict[tuple[float, bool], list[str | None]],
) -> list[Trial]:
    """The trials of one kind; `cache` keeps reference answers for the kinds that follow."""
    run = argparse.Namespace(**vars(args))
    if kind.vllm:
        run.streams, run.max_tokens = min(args.streams, VLLM_STREAMS), VLLM_MAX_TOKENS
        run.trial_timeout = max(args.trial_timeout, 400.0)  # the new worker's start-up
    prompts = [f"def task_{i}(values):" for i in range(run.streams)]
    references: list[str | None] = [None] * len(prompts)
    sampling = (kind.temperature, kind.seeded)
    if not kind.vllm and kind.compares and sampling not in cache:
        folder = root / f"{kind.name}-reference"
        folder.mkdir()
        reference_stack = build_stack(kind, folder, models, ENV)
        try:
            reference_stack.start(workers=1)
            cache[sampling] = asyncio.run(
                reference_answers(reference_stack.url, prompts, run.max_tokens, kind)
            )
        finally:
            reference_stack.stop()
    references = cache.get(sampling, references) if not kind.vllm else references
    trials = []
    for number in range(1, args.trials + 1):
        folder = root / f"{kind.name}-{number}"
        folder.mkdir(parents=True)
        stack = build_stack(kind, folder, models, ENV)
        extra = []
        try:
            extra = start(kind, stack, folder)
            if kind.vllm:
                references = asyncio.run(
                    reference_answers(stack.url, prompts, run.max_tokens, kind)
                )
            gateways = [stack.url] + [f"http://127.0.0.1:{g.env['DCOCO_PORT']}" for g in extra]
            scene = Scene(stack, gateways, [], extra)
            trial = asyncio.run(run_trial(kind, scene, prompts, references, run))
        finally:
            for gateway in extra:
                gateway.stop()
            stack.stop()
        trials.append(trial)
        print(f"{kind.name} {number}: {dict(trial.outcomes)} in {trial.seconds:.1f} s", flush=True)
        if any(trial.outcomes[o] for o in BAD):
            print(stack.logs(), file=sys.stderr)
    return trials


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", choices=list(KINDS), default=list(KINDS))
    parser.add_argument("--trials", type=int, default=3, help="trials of each kind")
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=1000)
    parser.add_argument(
        "--trial-timeout", type=float, default=120.0, help="seconds after the fault"
    )
    parser.add_argument("--out", type=Path, help="write the tables here (Markdown)")
    args = parser.parse_args()
    began = time.monotonic()
    results = {}
    with tempfile.TemporaryDirectory(prefix="dcoco-faults-") as scratch:
        root = Path(scratch)
        models = write_models(root / "models")
        references: dict[tuple[float, bool], list[str | None]] = {}
        for name in args.kinds:
            results[name] = run_kind(KINDS[name], root, models, args, references)
    print(summary_table(results))
    if args.out is not None:
        write_report(args, results, time.monotonic() - began)
    bad = sum(t.outcomes[o] for trials in results.values() for t in trials for o in BAD)
    return 1 if bad else 0


def write_report(args: argparse.Namespace, results: dict[str, list[Trial]], seconds: float) -> None:
    outcomes = "\n".join(f"- {name}: {meaning}" for name, meaning in OUTCOMES.items())
    kinds = "\n".join(f"- **{name}**: {KINDS[name].what}" for name in results)
    sections = "\n\n".join(
        f"## {name}\n\n{KINDS[name].what}.\n\n{trial_table(trials)}"
        for name, trials in results.items()
    )
    args.out.write_text(
        "# Fault trials\n\n"
        f"Each trial starts a fresh stack (redis-server, two workers, one gateway or two, the "
        f"small test models in vanilla decoding), opens {args.streams} concurrent streams with "
        f"distinct prompts (`max_tokens` {args.max_tokens}), waits until every stream is "
        "generating, applies the fault and follows every stream to its end, at most "
        f"{args.trial_timeout:g} s later (lease {ENV['DCOCO_LEASE_S']} s). The vLLM kind runs "
        f"{VLLM_STREAMS} streams of {VLLM_MAX_TOKENS} tokens on the embedded tiny pair, with one "
        "vLLM worker before the kill and another started after it. The kinds:\n\n"
        f"{kinds}\n\nEach stream ends as one of:\n\n{outcomes}\n\n"
        "The reference is each prompt's answer to one non-streamed request on an idle "
        "single-worker stack (for vllm-kill, on the trial's own stack before the kill).\n\n"
        f"```\nmake faults  # runs: python {' '.join(sys.argv)}\n```\n\n"
        f"Machine: {machine()}. The run took {seconds / 60:.1f} minutes.\n\n"
        f"{summary_table(results)}\n\n{sections}\n"
    )


if __name__ == "__main__":
    sys.exit(main())
