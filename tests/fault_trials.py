"""Worker SIGKILL trials (`make faults`): the fault test's kill, repeated at load and counted.

Each trial starts a fresh stack (redis-server, two workers, one gateway; the small test models
from `factories.write_models`), opens N concurrent greedy streams with distinct prompts, waits
until every stream is generating, SIGKILLs the worker that holds the most of them and follows
every stream to its end. Each stream ends as one of OUTCOMES; the reference is each prompt's
answer to one non-streamed request on an idle single-worker stack.

    .venv/bin/python tests/fault_trials.py [--trials 10] [--streams 32] [--out docs/faults.md]

It lives beside the test helpers it drives (stack.py, factories.py) and is not collected by
pytest (its name does not start with test_). Exit status 1 if any stream was different, hung
or lost.
"""

import argparse
import asyncio
import json
import os
import platform
import signal
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
from stack import Stack, owner_pid

OUTCOMES = {
    "identical": "finished ([DONE] and a finish reason) with the single-request reference's text",
    "different": "finished with other text (tokens lost, repeated or crossed between streams)",
    "error": "ended with an explicit error, as an HTTP status or an error event",
    "hung": "still open when the trial's time limit passed",
    "lost": "ended without a finish reason and without an error (a cut connection)",
}
STARTED_TIMEOUT_S = 60.0  # every stream generating, or the trial is void
ENV = {"DCOCO_MAX_MODEL_LEN": "4096", "DCOCO_LEASE_S": "2", "DCOCO_STALL_TIMEOUT_S": "30"}


@dataclass
class Stream:
    prompt: str
    text: str = ""
    response_id: str | None = None
    finish: str | None = None
    error: str | None = None
    done: bool = False  # [DONE] arrived
    generating: asyncio.Event = field(default_factory=asyncio.Event)

    def outcome(self, reference: str, hung: bool) -> str:
        if hung:
            return "hung"
        if self.error is not None:
            return "error"
        if not self.done or self.finish is None:
            return "lost"
        return "identical" if self.text == reference else "different"


def body(prompt: str, max_tokens: int, stream: bool) -> dict[str, object]:
    messages = [{"role": "user", "content": prompt}]
    return {
        "model": Stack.MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


async def follow(client: httpx.AsyncClient, stream: Stream, max_tokens: int) -> None:
    request = body(stream.prompt, max_tokens, stream=True)
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
                for choice in chunk["choices"]:
                    stream.text += choice["delta"].get("content") or ""
                    stream.finish = choice["finish_reason"] or stream.finish
                if stream.text:
                    stream.generating.set()
    except httpx.HTTPError:
        return  # neither finished nor an explicit error: counted as lost


@dataclass
class Trial:
    held: int  # streams the killed worker held at the kill
    mid_stream: int  # of those, not yet finished
    outcomes: Counter[str]
    seconds: float


async def run_trial(
    stack: Stack, prompts: list[str], references: list[str], args: argparse.Namespace
) -> Trial:
    started = time.monotonic()
    streams = [Stream(p) for p in prompts]
    timeout = httpx.Timeout(args.trial_timeout, connect=5.0)
    limits = httpx.Limits(max_connections=len(streams) + 4)
    async with httpx.AsyncClient(base_url=stack.url, timeout=timeout, limits=limits) as client:
        tasks = [asyncio.create_task(follow(client, s, args.max_tokens)) for s in streams]
        waiting = [asyncio.create_task(s.generating.wait()) for s in streams]
        _, not_yet = await asyncio.wait(waiting, timeout=STARTED_TIMEOUT_S)
        for task in not_yet:
            task.cancel()
        owners = [owner_pid(stack.redis, s.response_id) if s.response_id else None for s in streams]
        held_by = Counter(pid for pid in owners if pid is not None)
        victim, held = held_by.most_common(1)[0] if held_by else (stack.workers[0].pid, 0)
        mid_stream = sum(
            1 for s, pid in zip(streams, owners, strict=True) if pid == victim and not s.done
        )
        os.kill(victim, signal.SIGKILL)
        _, pending = await asyncio.wait(tasks, timeout=args.trial_timeout)
        for task in pending:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    outcomes = Counter(
        s.outcome(ref, hung=t in pending)
        for s, ref, t in zip(streams, references, tasks, strict=True)
    )
    return Trial(held, mid_stream, outcomes, time.monotonic() - started)


async def reference_answers(stack: Stack, prompts: list[str], max_tokens: int) -> list[str]:
    """Each prompt alone on an idle worker, one non-streamed request at a time."""
    answers = []
    async with httpx.AsyncClient(base_url=stack.url, timeout=300) as client:
        for prompt in prompts:
            reply = await client.post(
                "/v1/chat/completions", json=body(prompt, max_tokens, stream=False)
            )
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


def table(trials: list[Trial]) -> str:
    head = f"| trial | killed worker held | mid-stream at kill | {' | '.join(OUTCOMES)} | seconds |"
    rows = [head, "|" + "---:|" * (len(OUTCOMES) + 4)]
    for number, t in enumerate(trials, 1):
        counts = " | ".join(str(t.outcomes[o]) for o in OUTCOMES)
        rows.append(f"| {number} | {t.held} | {t.mid_stream} | {counts} | {t.seconds:.1f} |")
    total = Counter[str]()
    for t in trials:
        total.update(t.outcomes)
    counts = " | ".join(f"**{total[o]}**" for o in OUTCOMES)
    held = sum(t.held for t in trials)
    mid = sum(t.mid_stream for t in trials)
    rows.append(f"| all | {held} | {mid} | {counts} | {sum(t.seconds for t in trials):.1f} |")
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=1000)
    # Vanilla decoding, one token per step, keeps the kill mid-generation; greedy speculative
    # decoding is lossless, so dcoco and dflash must give the same table.
    parser.add_argument("--mode", choices=("vanilla", "dflash", "dcoco"), default="vanilla")
    parser.add_argument("--trial-timeout", type=float, default=120.0, help="seconds after the kill")
    parser.add_argument("--out", type=Path, help="write the table here (Markdown)")
    args = parser.parse_args()
    env = ENV | {"DCOCO_MODE": args.mode}
    began = time.monotonic()
    prompts = [f"def task_{i}(values):" for i in range(args.streams)]
    trials = []
    with tempfile.TemporaryDirectory(prefix="dcoco-faults-") as scratch:
        root = Path(scratch)
        models = write_models(root / "models")
        (root / "reference").mkdir()
        reference_stack = Stack(root / "reference", models, **env)
        try:
            references = asyncio.run(
                reference_answers(reference_stack.start(workers=1), prompts, args.max_tokens)
            )
        finally:
            reference_stack.stop()
        for number in range(1, args.trials + 1):
            folder = root / f"trial-{number}"
            folder.mkdir()
            stack = Stack(folder, models, **env)
            try:
                trial = asyncio.run(run_trial(stack.start(workers=2), prompts, references, args))
            finally:
                stack.stop()
            trials.append(trial)
            print(f"trial {number}: {dict(trial.outcomes)} in {trial.seconds:.1f} s", flush=True)
            if any(trial.outcomes[o] for o in ("different", "hung", "lost")):
                print(stack.logs(), file=sys.stderr)
    report = table(trials)
    print(report)
    if args.out is not None:
        write_report(args, report, time.monotonic() - began)
    bad = sum(t.outcomes[o] for t in trials for o in ("different", "hung", "lost"))
    return 1 if bad else 0


def write_report(args: argparse.Namespace, report: str, seconds: float) -> None:
    outcomes = "\n".join(f"- {name}: {meaning}" for name, meaning in OUTCOMES.items())
    args.out.write_text(
        "# Worker SIGKILL trials\n\n"
        f"Each trial starts a fresh stack (redis-server, two workers, one gateway, the small test "
        f"models), opens {args.streams} concurrent greedy streams with distinct prompts "
        f"(`max_tokens` {args.max_tokens}, {args.mode} decoding), waits until every "
        "stream is generating, SIGKILLs the worker that holds the most of them and follows every "
        f"stream to its end, at most {args.trial_timeout:g} s after the kill (lease "
        f"{ENV['DCOCO_LEASE_S']} s). Each stream ends as one of:\n\n{outcomes}\n\n"
        "The reference is each prompt's answer to one non-streamed request on an idle "
        "single-worker stack.\n\n"
        f"```\nmake faults  # runs: python {' '.join(sys.argv)}\n```\n\n"
        f"Machine: {machine()}. The run took {seconds / 60:.1f} minutes.\n\n{report}\n"
    )


if __name__ == "__main__":
    sys.exit(main())
