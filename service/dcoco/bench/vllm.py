"""vLLM against our stack, side by side in one run, on the embedded DCOCO pair (greedy, fp32).

Three servers, one at a time, with a pause between them (vLLM's processes busy-spin for a
moment after their last message):
- `vllm`: vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`) with the
  DCOCO drafter through our plugin;
- `gateway + vllm worker`: our gateway, Redis and `dcoco worker --engine vllm`;
- `gateway + torch worker`: our gateway, Redis and the embedded torch engine.
Each serves the same held-out prompts twice through the official openai client, streamed: one
request at a time (time to first token, tokens/s of a single stream), then all at once
(aggregate tokens/s). Accepted length (bonus included) comes from each server's counters.
A second table compares acceptance inside vLLM with the torch engine's (`vllm_acceptance`).

    python -m dcoco.bench.vllm --vllm-python .venv-vllm/bin/python [--out docs/bench-vllm.md]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import openai

from dcoco.bench.vllm_acceptance import acceptance_rows
from dcoco.paths import TINY_DCOCO, TINY_HELDOUT, TINY_MODEL_NAME, TINY_TARGET
from dcoco.serve import free_port, start_redis, stop
from dcoco.vllm.cpu_env import cpu_preload

MODEL = TINY_MODEL_NAME
PAUSE_S = 5.0  # lets the previous server's processes go quiet
READY_S = 300.0
# On CPU this only sizes vLLM's start-up check of free memory (the KV cache is
# VLLM_CPU_KVCACHE_SPACE); its 0.92 default fails whenever the machine is shared.
MEMORY_SHARE = 0.3


def vllm_env(python: str) -> dict[str, str]:
    """vLLM on CPU: no hub, 1 GiB of KV cache, its bundled OpenMP (and tcmalloc where
    installed) preloaded; only vLLM's processes get them."""
    preload = cpu_preload(Path(python).parent.parent)
    return {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "LD_PRELOAD": preload}


def prompts(per_suite: int) -> list[str]:
    lines = []
    for suite in sorted(TINY_HELDOUT.glob("*.jsonl")):
        lines += suite.read_text().splitlines()[:per_suite]
    return [json.loads(line)["prompt"] for line in lines]


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


def acceptance(
    before: dict[str, float], after: dict[str, float], cycles: str, accepted: str
) -> float:
    drafts = after.get(cycles, 0) - before.get(cycles, 0)
    return 1 + (after.get(accepted, 0) - before.get(accepted, 0)) / drafts if drafts else 1.0


async def stream(
    client: openai.AsyncOpenAI, prompt: str, max_tokens: int
) -> tuple[float, float, int]:
    """(time to first content chunk, whole time, completion tokens) of one streamed chat."""
    started = time.perf_counter()
    first, tokens = 0.0, 0
    chunks = await client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in chunks:
        if not first and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return first, time.perf_counter() - started, tokens


async def workload(url: str, texts: list[str], max_tokens: int) -> dict[str, float]:
    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", timeout=300) as client:
        await stream(client, texts[0], 8)  # warm up
        single = [await stream(client, t, max_tokens) for t in texts]
        started = time.perf_counter()
        together = await asyncio.gather(*(stream(client, t, max_tokens) for t in texts))
        wall = time.perf_counter() - started
    return {
        "ttft_p50_ms": statistics.median(s[0] for s in single) * 1000,
        "single_tps": sum(s[2] for s in single) / sum(s[1] for s in single),
        "batch_tps": sum(s[2] for s in together) / wall,
        "tokens": float(sum(s[2] for s in single)),
    }


def wait_ready(url: str, processes: list[subprocess.Popen[bytes]], log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"a process exited while {url} was starting:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} was not ready after {READY_S:.0f} s")


def vllm_server(args: argparse.Namespace, folder: Path) -> dict[str, float]:
    port = free_port()
    spec = {"method": "dflash", "model": str(TINY_DCOCO), "num_speculative_tokens": 15}
    command = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--port", str(port)]
    command += ["--host", "127.0.0.1", "--model", str(TINY_TARGET), "--dtype", "float32"]
    command += ["--served-model-name", MODEL, "--max-model-len", "1024", "--seed", "0"]
    command += ["--speculative-config", json.dumps(spec), "--max-num-seqs", str(args.concurrency)]
    command += ["--gpu-memory-utilization", str(MEMORY_SHARE)]
    env = (
        os.environ | vllm_env(args.vllm_python) | {"PROMETHEUS_MULTIPROC_DIR": str(folder / "prom")}
    )
    (folder / "prom").mkdir()
    with (folder / "vllm-server.log").open("wb") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/health", [server], folder / "vllm-server.log")
        before = scrape(f"{url}/metrics")
        result = asyncio.run(workload(url, args.texts, args.max_tokens))
        after = scrape(f"{url}/metrics")
    finally:
        stop([server], drain_s=10)
    drafts, accepted = (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    )
    return result | {"accepted_length": acceptance(before, after, drafts, accepted)}


def our_stack(engine: str, args: argparse.Namespace, folder: Path) -> dict[str, float]:
    redis_port, port, metrics_port = free_port(), free_port(), free_port()
    env = dict(os.environ) | {
        "DCOCO_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
        "DCOCO_PORT": str(port),
        "DCOCO_METRICS_PORT": str(metrics_port),
        "DCOCO_MODEL_NAME": MODEL,
        "DCOCO_ENGINE": engine,
        "DCOCO_MAX_BATCH_SIZE": str(args.concurrency),
        "DCOCO_LOG_LEVEL": "warning",
        "DCOCO_VLLM_ARGS": json.dumps({"gpu_memory_utilization": MEMORY_SHARE}),
        "DCOCO_PRECISION": "fp32",  # as vLLM's own server runs (--dtype float32)
    }
    if engine == "vllm":  # the same process environment as vLLM's own server gets
        env |= vllm_env(args.vllm_python)
    python = args.vllm_python if engine == "vllm" else sys.executable
    redis = start_redis(redis_port, folder)
    with (folder / f"{engine}.log").open("wb") as log:
        worker = subprocess.Popen(
            [python, "-m", "dcoco", "worker"],
            env=env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        gateway = subprocess.Popen(
            [sys.executable, "-m", "dcoco", "gateway"], env=env, stdout=log, stderr=log
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(f"{url}/readyz", [worker, gateway], folder / f"{engine}.log")
        time.sleep(1.0)  # the gateway's model catalogue refresh
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        before = scrape(metrics)
        result = asyncio.run(workload(url, args.texts, args.max_tokens))
        after = scrape(metrics)
    finally:
        stop([gateway, worker, redis], drain_s=5)
    cycles, accepted = "dcoco_spec_cycles_total", "dcoco_spec_accepted_tokens_total"
    return result | {"accepted_length": acceptance(before, after, cycles, accepted)}


def table(results: dict[str, dict[str, float]], args: argparse.Namespace) -> str:
    rows = [
        "# vLLM and our stack on the embedded pair",
        "",
        "Generated by `make bench-vllm` (`python -m dcoco.bench.vllm`), vllm-cpu 0.32.0, fp32, "
        f"greedy, B = 15, K = 16, {len(args.texts)} held-out prompts ({args.per_suite} each of "
        f"code, math, prose), up to {args.max_tokens} tokens each, streamed through the openai "
        "client; everything, the client included, on this machine's 2 cores.",
        "",
        "| server | TTFT p50, one at a time | tokens/s, one at a time | tokens/s, all at once "
        "| accepted length |",
        "|---|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        rows.append(
            f"| {name} | {r['ttft_p50_ms']:.1f} ms | {r['single_tps']:.0f} | {r['batch_tps']:.0f} "
            f"| {r['accepted_length']:.3f} |"
        )
    return "\n".join(rows) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vllm-python", required=True, help="the interpreter vLLM is installed in")
    parser.add_argument("--per-suite", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.texts = prompts(args.per_suite)
    runs = {
        "vLLM's OpenAI server + DCOCO plugin": vllm_server,
        "our gateway + vllm worker": lambda a, f: our_stack("vllm", a, f),
        "our gateway + torch worker": lambda a, f: our_stack("torch", a, f),
    }
    results = {}
    with tempfile.TemporaryDirectory(prefix="dcoco-bench-vllm-") as folder:
        for name, run in runs.items():
            results[name] = run(args, Path(folder))
            print(name, json.dumps({k: round(v, 3) for k, v in results[name].items()}), flush=True)
            time.sleep(PAUSE_S)
    text = table(results, args)
    rows = acceptance_rows(args.vllm_python, os.environ | vllm_env(args.vllm_python), 8, 128)
    text += "\n## Acceptance inside vLLM and in the torch engine\n\n" + "\n".join(rows) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
