"""Real processes for serving tests: a redis-server on a free port, workers and gateways started
with `python -m dcoco`, each logging to a file that failures print."""

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import redis

from dcoco.queue import keys
from dcoco.serve import free_port, redis_server_binary


class RedisServer:
    def __init__(self, folder: Path, appendonly: bool = False) -> None:
        self.folder, self.appendonly = folder, appendonly
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        args = [
            redis_server_binary(),
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ]
        args += ["--dir", str(self.folder), "--appendonly", "yes" if self.appendonly else "no"]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.2)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                return
            except (redis.ConnectionError, redis.BusyLoadingError):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def client(self) -> "redis.Redis[str]":
        return redis.Redis(port=self.port, decode_responses=True)


class Service:
    """`python -m dcoco <command>` with extra environment, logging to a file."""

    def __init__(
        self, command: str, env: dict[str, str], log: Path, python: str = sys.executable
    ) -> None:
        self.command, self.log, self.python = command, log, python
        self.env = dict(os.environ) | {"DCOCO_LOG_LEVEL": "info"} | env
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> "Service":
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [self.python, "-m", "dcoco", self.command], env=self.env, stdout=out, stderr=out
            )
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(sig)

    def stop(self, timeout: float = 30) -> int | None:
        self.signal(signal.SIGTERM)
        if self.process is not None:
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            return self.process.returncode
        return None

    def tail(self, lines: int = 40) -> str:
        return (
            "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
            if self.log.exists()
            else ""
        )


def wait_for(check: "object", timeout: float = 60, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():  # type: ignore[operator]
                return
        except (OSError, urllib.error.URLError, redis.RedisError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what}")


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as error:
        return int(error.code)


def worker_ids(server: RedisServer, model: str) -> list[str]:
    return list(server.client().zrange(f"dcoco:{model}:workers", 0, -1))


def owner_pid(server: RedisServer, response_id: str, choice: int = 0) -> int | None:
    """The pid of the worker that owns one choice of a response now, if any (worker ids are
    `<host>-<pid>` by default)."""
    owner = server.client().get(keys.owner(f"{response_id}-{choice}"))
    return None if owner is None else int(owner.split(" ")[0].rsplit("-", 1)[1])


def metric_values(text: str) -> dict[str, float]:
    """Prometheus text format -> {"name{labels}": value}."""
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(reply.read().decode())


class Stack:
    """Redis, workers and one gateway for the models in `models` (served as MODEL)."""

    MODEL = "tiny"

    def __init__(
        self,
        root: Path,
        models: dict[str, Path],
        appendonly: bool = False,
        worker_python: str = sys.executable,
        **env: str,
    ) -> None:
        """`worker_python`: the interpreter workers run under (vLLM lives in a venv of its own)."""
        self.root, self.worker_python = root, worker_python
        self.redis = RedisServer(root, appendonly)
        self.models = models
        self.env = {
            "DCOCO_REDIS_URL": self.redis.url,
            "DCOCO_MODEL_NAME": self.MODEL,
            "DCOCO_TARGET": str(models["target"]),
            "DCOCO_DRAFTER": str(models["dcoco"]),
            "DCOCO_MAX_MODEL_LEN": "512",
            "DCOCO_PRECISION": "fp32",  # exact: served answers equal in-process references
            "DCOCO_ADAPTIVE": "false",  # fixed B: served counters equal in-process ones
            "DCOCO_LEASE_S": "2",
            "DCOCO_HEARTBEAT_S": "0.5",
            "DCOCO_QUEUE_TIMEOUT_S": "20",
            "DCOCO_STALL_TIMEOUT_S": "30",
            "DCOCO_DRAIN_TIMEOUT_S": "5",
        } | env
        self.port = free_port()
        self.gateway = Service(
            "gateway", self.env | {"DCOCO_PORT": str(self.port)}, root / "gateway.log"
        )
        self.workers: list[Service] = []
        self.metrics_ports: list[int] = []

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def add_worker(self, **env: str) -> Service:
        port = free_port()
        worker_env = self.env | {"DCOCO_METRICS_PORT": str(port)} | env
        log = self.root / f"worker{len(self.workers)}.log"
        worker = Service("worker", worker_env, log, self.worker_python).start()
        self.workers.append(worker)
        self.metrics_ports.append(port)
        return worker

    def start(self, workers: int = 1, timeout: float = 60, **worker_env: str) -> "Stack":
        for _ in range(workers):
            self.add_worker(**worker_env)
        self.gateway.start()
        wait_for(lambda: http_status(f"{self.url}/healthz") == 200, what="the gateway")
        self.wait_workers(workers, timeout)
        return self

    def wait_workers(self, count: int, timeout: float = 60) -> None:
        wait_for(
            lambda: len(worker_ids(self.redis, self.MODEL)) >= count,
            timeout=timeout,
            what=f"{count} workers",
        )
        wait_for(lambda: http_status(f"{self.url}/readyz") == 200, what="readiness")

    def stop(self) -> None:
        self.gateway.stop()
        for worker in self.workers:
            worker.stop()
        self.redis.stop()

    def logs(self) -> str:
        parts = [f"--- {s.log.name}\n{s.tail()}" for s in [self.gateway, *self.workers]]
        return "\n".join(parts)
