"""`dcoco bench --embedded vanilla,dflash,...`: one embedded stack per variant (`dcoco serve`
on free ports, each with its own Redis, worker and gateway, configured by environment), all
started at once and measured in one interleaved run, then stopped.

A variant that does not start, or that sets a DCOCO_* variable this build's worker does not
know (pydantic-settings would ignore it silently, and the variant would quietly be another
one), is reported as failed with the reason, and the others are measured.

A stack serves as soon as it is ready and compiles its layers' shape classes in the background
(`dcoco_engine_compiled_shapes`). Measuring starts once every stack has compiled them all: a
stack still compiling would take the cores the measured one runs on (on 2 cores, three stacks
compiling put plain decoding at 17 against 30 tokens/s), and run its own steps eagerly.
"""

import argparse
import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from dcoco.bench.main import Endpoint, check_all, measure
from dcoco.paths import REPO_ROOT
from dcoco.serve import free_port

READY_TIMEOUT_S = 180.0
COMPILE_TIMEOUT_S = 900.0  # for every stack's background compiles together
STOP_TIMEOUT_S = 40.0  # `dcoco serve` drains its worker, then stops Redis
MODEL_NAME = "bench"
VARIANTS: dict[str, dict[str, str]] = {  # {models}: the --models folder
    "vanilla": {"DCOCO_MODE": "vanilla"},
    "ngram": {"DCOCO_MODE": "ngram", "DCOCO_ADAPTIVE": "false"},
    "dflash": {
        "DCOCO_MODE": "dflash",
        "DCOCO_DRAFTER": "{models}/dflash",
        "DCOCO_ADAPTIVE": "false",
    },
    "dcoco": {"DCOCO_MODE": "dcoco", "DCOCO_DRAFTER": "{models}/dcoco", "DCOCO_ADAPTIVE": "false"},
    "dcoco-adaptive": {
        "DCOCO_MODE": "dcoco",
        "DCOCO_DRAFTER": "{models}/dcoco",
        "DCOCO_ADAPTIVE": "true",
        "DCOCO_LOOKUP": "false",
    },
    "dcoco-lookup": {  # the worker's default
        "DCOCO_MODE": "dcoco",
        "DCOCO_DRAFTER": "{models}/dcoco",
        "DCOCO_ADAPTIVE": "true",
        "DCOCO_LOOKUP": "true",
    },
}


@dataclass(frozen=True)
class Stack:
    name: str
    url: str
    metrics_url: str  # the worker's: the gateway's /metrics has no speculation counters
    env: dict[str, str]  # the variant's settings
    process: subprocess.Popen[bytes]
    log: Path


def variant_env(name: str, models: Path) -> dict[str, str]:
    settings = {k: v.format(models=models) for k, v in VARIANTS[name].items()}
    return {"DCOCO_TARGET": str(models / "target")} | settings


def unknown_settings(env: dict[str, str]) -> list[str]:
    from dcoco.settings import GatewaySettings, WorkerSettings

    known = set(WorkerSettings.model_fields) | set(GatewaySettings.model_fields)
    return [k for k in env if k.startswith("DCOCO_") and k[6:].lower() not in known]


def start(name: str, models: Path, logs: Path) -> Stack:
    settings = variant_env(name, models)
    port, metrics_port = free_port(), free_port()
    env = dict(os.environ) | settings
    env |= {
        "DCOCO_METRICS_PORT": str(metrics_port),
        "DCOCO_MODEL_NAME": MODEL_NAME,
        "DCOCO_LOG_LEVEL": "warning",
    }
    log = logs / f"{name}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "dcoco", "serve", "--port", str(port)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    return Stack(name, url, f"http://127.0.0.1:{metrics_port}/metrics", settings, process, log)


def wait_ready(stack: Stack, deadline: float) -> str | None:
    """None once the gateway is ready, else why not."""
    while time.monotonic() < deadline:
        if stack.process.poll() is not None:
            tail = stack.log.read_text(errors="replace").strip().splitlines()[-1:]
            return f"exited with status {stack.process.returncode}: {' '.join(tail)}"
        try:
            with urllib.request.urlopen(f"{stack.url}/readyz", timeout=1) as reply:
                if reply.status == 200:
                    return None
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.3)
    return f"not ready after {READY_TIMEOUT_S:.0f} s"


def shapes_left(metrics: str) -> int:
    """Shape classes a worker's /metrics text says it still compiles: planned less ready, over
    the parts whose compile has not failed (those run eagerly for good); 0 where it compiles
    nothing (no such family: fp32, vLLM)."""
    left: dict[str, float] = {}
    failed: set[str] = set()
    for family in text_string_to_metric_families(metrics):
        for sample in family.samples:
            part = sample.labels.get("part", "")
            if sample.name == "dcoco_engine_compiled_shapes":
                sign = 1 if sample.labels.get("state") == "planned" else -1
                left[part] = left.get(part, 0.0) + sign * sample.value
            elif sample.name == "dcoco_engine_compile_failed" and sample.value:
                failed.add(part)
    return int(sum(n for part, n in left.items() if part not in failed))


def wait_compiled(stack: Stack, deadline: float) -> str | None:
    """None once the stack's worker has compiled every shape class it plans, else a note saying
    what was left at `deadline`."""
    left: int | None = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(stack.metrics_url, timeout=2) as reply:
                left = shapes_left(reply.read().decode())
        except (urllib.error.URLError, OSError, ValueError):
            left = None
        if left == 0:
            return None
        time.sleep(1.0)
    what = "its /metrics did not answer" if left is None else f"{left} shape classes left"
    return f"{stack.name}: measured while still compiling ({what} after {COMPILE_TIMEOUT_S:.0f} s)"


def stop(stack: Stack) -> None:
    if stack.process.poll() is None:
        stack.process.send_signal(signal.SIGTERM)
        try:
            stack.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stack.process.kill()
            stack.process.wait()


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """The first SIGTERM raises SystemExit, as Ctrl-C raises KeyboardInterrupt, so that the
    `finally` that stops the stacks runs. The stacks do not get the signal themselves."""

    def exit_once(signum: int, _frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, exit_once)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def embedded(
    names: list[str], models: Path, logs: Path
) -> Iterator[tuple[list[Stack], dict[str, str]]]:
    """The stacks that came up, and {variant: why it failed} for the others; all stopped on
    exit, Ctrl-C and SIGTERM included."""
    logs.mkdir(parents=True, exist_ok=True)
    failed: dict[str, str] = {}
    started: list[Stack] = []
    with sigterm_as_exit():
        try:
            for name in names:
                unknown = unknown_settings(variant_env(name, models))
                if unknown:
                    failed[name] = f"{', '.join(unknown)}: not a setting of this build's worker"
                else:
                    started.append(start(name, models, logs))
            deadline = time.monotonic() + READY_TIMEOUT_S
            ready = []
            for stack in started:
                problem = wait_ready(stack, deadline)
                if problem is None:
                    ready.append(stack)
                else:
                    failed[stack.name] = f"did not start ({problem}; log: {stack.log})"
            yield ready, failed
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)  # each stop is bounded: let all run
            for stack in started:
                stop(stack)


def run_embedded(args: argparse.Namespace) -> None:
    """The --embedded run: start, check, measure, stop."""
    with embedded(args.embedded, args.models, args.logs) as (stacks, failed):
        deadline = time.monotonic() + COMPILE_TIMEOUT_S
        compiling = [note for s in stacks if (note := wait_compiled(s, deadline))]
        found = [Endpoint(s.name, s.url, s.metrics_url) for s in stacks]
        servers = asyncio.run(check_all(found, MODEL_NAME)) if found else []
        notes = [
            f"{s.name}: `dcoco serve` with "
            + " ".join(f"{k}={v.replace(f'{REPO_ROOT}/', '')}" for k, v in s.env.items())
            for s in stacks
        ]
        measure(args, servers, [s.name for s in stacks], failed, notes + compiling)
