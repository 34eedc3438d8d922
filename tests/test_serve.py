"""`dcoco serve`: the all-in-one stack starts, answers, and Ctrl-C stops all three processes;
killed outright, it takes them with it."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from dcoco.paths import DEFAULT_MODEL_NAME
from dcoco.serve import embedded_workers, free_port, port_is_free, readiness_urls
from factories import write_models
from stack import http_status, wait_for

pytestmark = pytest.mark.slow


def children_of(pid: int) -> list[int]:
    listing = subprocess.run(["ps", "-o", "pid=,ppid="], capture_output=True, text=True, check=True)
    pairs = [line.split() for line in listing.stdout.splitlines()]
    return [int(child) for child, parent in pairs if int(parent) == pid]


def start_serve(models: dict[str, Path], port: int, metrics_port: int) -> subprocess.Popen[bytes]:
    """`dcoco serve` on `port`, returned once it says it is serving."""
    env = dict(os.environ) | {
        "DCOCO_TARGET": str(models["target"]),
        "DCOCO_DRAFTER": str(models["dcoco"]),
        "DCOCO_METRICS_PORT": str(metrics_port),
    }
    env.pop("DCOCO_REDIS_URL", None)  # no Redis configured: serve starts a private one
    serve = subprocess.Popen(
        [sys.executable, "-m", "dcoco", "serve", "--port", str(port)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert serve.stdout is not None
    assert b"DCOCO is serving on" in serve.stdout.readline()  # printed once ready
    return serve


def listening_ports(pid: int) -> set[int]:
    """The TCP ports a process listens on (from /proc, so for any of our own processes)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def running(pid: int) -> bool:
    """Whether any thread of a process is alive. A killed process's main thread can be a zombie
    while its other threads still exit, holding its sockets open until the last one is gone."""
    try:
        threads = list(Path(f"/proc/{pid}/task").iterdir())
    except FileNotFoundError:
        return False
    for thread in threads:
        try:
            stat = (thread / "stat").read_text()
        except FileNotFoundError:  # exited since the listing
            continue
        if stat.rsplit(")", 1)[1].split()[0] != "Z":
            return True
    return False


def answers(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def test_serve_starts_answers_and_stops_cleanly_on_ctrl_c(tmp_path: Path) -> None:
    models = write_models(tmp_path, distilled=False)
    port = free_port()
    serve = start_serve(models, port, free_port())
    try:
        assert http_status(f"http://127.0.0.1:{port}/readyz") == 200
        components = children_of(serve.pid)
        assert len(components) == 3  # redis-server, worker, gateway
        body = {"model": DEFAULT_MODEL_NAME, "prompt": "x = [", "max_tokens": 5, "temperature": 0}
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/completions", json=body, timeout=30)
        assert reply.status_code == 200
        assert reply.json()["usage"]["completion_tokens"] == 5
        serve.send_signal(signal.SIGINT)
        assert serve.wait(timeout=60) == 0
        assert all(not Path(f"/proc/{pid}").exists() for pid in components)
    finally:
        if serve.poll() is None:
            serve.kill()


def test_a_killed_serve_leaves_nothing_behind_and_starts_again(tmp_path: Path) -> None:
    """SIGKILL gives `serve` no chance to stop its children: they must die with it."""
    models = write_models(tmp_path, distilled=False)
    port, metrics_port = free_port(), free_port()
    serve = start_serve(models, port, metrics_port)
    components = children_of(serve.pid)
    try:
        ports = set().union(*(listening_ports(pid) for pid in components))
        assert {port, metrics_port} < ports  # and the private Redis's
        serve.kill()
        serve.wait()
        killed = time.monotonic()
        wait_for(
            lambda: not any(running(pid) for pid in components),
            timeout=5,
            what="every component of the killed serve to exit",
        )
        assert not [p for p in ports if answers(p)]
        assert time.monotonic() - killed < 5
        again = start_serve(models, port, metrics_port)  # what `make serve` does next
        again.send_signal(signal.SIGINT)
        assert again.wait(timeout=60) == 0
    finally:
        for pid in components:
            if running(pid):
                os.kill(pid, signal.SIGKILL)  # only if the test failed: no orphans either way


def test_serve_refuses_a_busy_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "dcoco", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1
    assert "already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_waits_for_every_worker_not_only_the_first_to_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DCOCO_METRICS_PORT", raising=False)
    monkeypatch.delenv("DCOCO_METRICS_HOST", raising=False)
    workers = embedded_workers(["smollm2", "tiny"], {})
    urls = readiness_urls("127.0.0.1", 8000, workers)
    assert urls[0] == "http://127.0.0.1:8000/readyz"
    assert urls[1:] == ["http://127.0.0.1:9400/readyz", "http://127.0.0.1:9401/readyz"]
    off = embedded_workers(["tiny"], {"DCOCO_METRICS_PORT": "0"})
    assert readiness_urls("127.0.0.1", 8000, off) == ["http://127.0.0.1:8000/readyz"]


def test_a_port_is_free_again_as_soon_as_its_listener_closed() -> None:
    """Closing a served connection first leaves it in TIME_WAIT on the port; a restart of
    `dcoco serve` there must not be refused for that, only for a live listener."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server side closes first: TIME_WAIT on the listening port
    client.close()
    assert not port_is_free("127.0.0.1", port)  # still listening
    listener.close()
    assert port_is_free("127.0.0.1", port)
