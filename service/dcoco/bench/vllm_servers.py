"""The servers `make bench-vllm` puts side by side, each started alone, on one model pair.

- vLLM's own OpenAI server (`python -m vllm.entrypoints.openai.api_server`): plain; fixed-B
  DFlash (the DCOCO checkpoint exported as stock DFlash, vLLM's own class); fixed-B DCOCO (the
  plugin); DCOCO with vLLM's static `num_speculative_tokens_per_batch_size` table; DCOCO with
  the plugin's adaptive planner (DCOCO_ADAPTIVE).
- Our gateway with Redis and a `dcoco worker --engine vllm` running adaptive DCOCO, or fixed-B
  DCOCO: beside vllm-dcoco that compares the fronts with no planner on either side.

vLLM's processes get their CPU environment (`vllm.cpu_env`); everything runs in fp32.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from dcoco.serve import free_port, start_redis, stop
from dcoco.vllm.cpu_env import cpu_env, usable_cpus
from dcoco.vllm.export import ExportOptions, export_drafter
from dcoco.vllm.spec_config import speculative_config

READY_S = 600.0  # a first start compiles for minutes on 2 cores
# On CPU this only sizes vLLM's start-up check of free memory (the KV cache is
# VLLM_CPU_KVCACHE_SPACE); its 0.92 default fails whenever the machine is shared.
MEMORY_SHARE = 0.3
# vLLM's static table for the `vllm-table` server: the whole block alone, a few drafts under
# light load, none under heavy load, as its users configure it.
STATIC_TABLE = [[1, 2, 15], [3, 8, 4], [9, 1024, 0]]


@dataclass(frozen=True)
class Pair:
    name: str  # the served model name
    target: Path
    dcoco: Path  # a DCOCODraftModel checkpoint


@dataclass(frozen=True)
class Server:
    """One server of the comparison: how to start it, and where its counters live."""

    name: str
    speculative: str  # "none", "dflash", "dcoco"
    adaptive: bool = False
    table: bool = False
    gateway: bool = False
    env: dict[str, str] = field(default_factory=dict)


SERVERS = (
    Server("vllm-plain", "none"),
    Server("vllm-dflash", "dflash"),
    Server("vllm-dcoco", "dcoco"),
    Server("vllm-table", "dcoco", table=True),
    Server("vllm-adaptive", "dcoco", adaptive=True),
    Server("gateway+vllm-adaptive", "dcoco", adaptive=True, gateway=True),
    Server("gateway+vllm-dcoco", "dcoco", gateway=True),
)


def vllm_env(python: str, environ: Mapping[str, str]) -> dict[str, str]:
    """vLLM on CPU: no hub, 1 GiB of KV cache, and what the worker gives vLLM's processes
    (`cpu_env`) where `environ` does not set it; only vLLM's processes get them."""
    base = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    return base | cpu_env(Path(python).parent.parent, environ, usable_cpus())


def server_spec_config(
    server: Server, pair: Pair, folder: Path, block: int
) -> dict[str, object] | None:
    if server.speculative == "none":
        return None
    drafter = pair.dcoco
    if server.speculative == "dflash":
        drafter = folder / "dflash-export"
        if not drafter.exists():
            export_drafter(pair.dcoco, drafter, ExportOptions(format="dflash"))
    table = {"num_speculative_tokens_per_batch_size": STATIC_TABLE} if server.table else {}
    return speculative_config(drafter, block, **table)


def vllm_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """The VLLM_* settings every server runs with, the KV cache's size aside: the benchmark's
    environment's and the core reservation `cpu_env` adds. The report names them, since they
    change vLLM's speed."""
    every = dict(environ) | vllm_env(sys.executable, environ)
    return {
        k: v
        for k, v in sorted(every.items())
        if k.startswith("VLLM_") and k != "VLLM_CPU_KVCACHE_SPACE"
    }


@contextmanager
def running(
    server: Server, pair: Pair, vllm_python: str, folder: Path, block: int, concurrency: int
) -> Iterator[tuple[str, str, list[int]]]:
    """Starts `server`; yields (its base URL, its Prometheus URL, the process ids it started);
    stops it on exit."""
    env = os.environ | vllm_env(vllm_python, os.environ)
    env["DCOCO_ADAPTIVE"] = "1" if server.adaptive else "0"
    log_path = folder / f"{server.name}.log"
    port = free_port()
    children: list[subprocess.Popen[bytes]] = []
    with log_path.open("ab") as log:
        if server.gateway:
            redis_port, metrics_port = free_port(), free_port()
            env |= {
                "DCOCO_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
                "DCOCO_PORT": str(port),
                "DCOCO_METRICS_PORT": str(metrics_port),
                "DCOCO_MODEL_NAME": pair.name,
                "DCOCO_ENGINE": "vllm",
                "DCOCO_TARGET": str(pair.target),
                "DCOCO_DRAFTER": str(pair.dcoco),
                "DCOCO_NUM_SPECULATIVE_TOKENS": str(block),
                "DCOCO_MAX_BATCH_SIZE": str(concurrency),
                "DCOCO_MAX_MODEL_LEN": "1024",
                "DCOCO_PRECISION": "fp32",
                "DCOCO_LOG_LEVEL": "warning",
                "DCOCO_VLLM_ARGS": json.dumps({"gpu_memory_utilization": MEMORY_SHARE}),
            }
            children.append(start_redis(redis_port, folder))
            worker = [vllm_python, "-m", "dcoco", "worker"]
            children.append(subprocess.Popen(worker, env=env, stdout=log, stderr=log))
            gateway = [sys.executable, "-m", "dcoco", "gateway"]
            children.append(subprocess.Popen(gateway, env=env, stdout=log, stderr=log))
            url, ready = f"http://127.0.0.1:{port}", "/readyz"
            metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        else:
            command = [vllm_python, "-m", "vllm.entrypoints.openai.api_server"]
            command += ["--host", "127.0.0.1", "--port", str(port), "--model", str(pair.target)]
            command += ["--dtype", "float32", "--served-model-name", pair.name, "--seed", "0"]
            command += ["--max-model-len", "1024", "--max-num-seqs", str(concurrency)]
            command += ["--gpu-memory-utilization", str(MEMORY_SHARE)]
            spec = server_spec_config(server, pair, folder, block)
            if spec is not None:
                command += ["--speculative-config", json.dumps(spec)]
            env["PROMETHEUS_MULTIPROC_DIR"] = str(folder / f"prom-{server.name}")
            Path(env["PROMETHEUS_MULTIPROC_DIR"]).mkdir(exist_ok=True)
            children.append(
                subprocess.Popen(command, env=env, stdout=log, stderr=log, start_new_session=True)
            )
            url, ready = f"http://127.0.0.1:{port}", "/health"
            metrics = f"{url}/metrics"
    try:
        wait_ready(url + ready, children, log_path)
        yield url, metrics, [p.pid for p in children]
    finally:
        stop(list(reversed(children)), drain_s=5)


def wait_ready(url: str, processes: list[subprocess.Popen[bytes]], log: Path) -> None:
    deadline = time.monotonic() + READY_S
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in processes):
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
            raise RuntimeError(f"a process exited while {url} was starting:\n{tail}")
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    time.sleep(1.0)  # a gateway's model catalogue refreshes each second
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} was not ready after {READY_S:.0f} s")
