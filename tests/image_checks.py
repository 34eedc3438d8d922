"""The images, run: `make images-test` (slow, not part of `make test`; root, podman and the
images `make images` builds).

Redis (the stand-in docker/podman/setup.sh makes), the gateway and two CPU workers run as
containers on a podman network of their own, each with a read-only root filesystem as a
non-root user, serving the image's embedded tiny pair. The official openai client runs against
the gateway's published port; one worker is killed mid-stream and every stream must still come
out whole and exact. A container that cannot reach Redis must stay up, unready, and say why in
its log; a worker without a model must exit saying which file is missing. docker/compose.yaml
comes up under podman-compose and passes the same smoke test.
"""

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest
import redis
import yaml

from containers import LOCKED_DOWN, Container, http_status, podman, wait_until
from dcoco.queue import keys
from dcoco.serve import free_port

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "build" / "image-checks"  # this run's container logs, written at teardown
PREFIX = f"dcoco-it-{os.getpid()}"
GATEWAY, WORKER = "localhost/dcoco-gateway", "localhost/dcoco-worker-cpu"
REDIS = "docker.io/library/redis:7.4-alpine"
MODEL = "dcoco-tiny"
TINY = {  # the image's embedded tiny pair: quick to load and to run on a CPU
    "DCOCO_MODEL_NAME": MODEL,
    "DCOCO_TARGET": "/opt/dcoco/models/tiny/target",
    "DCOCO_DRAFTER": "/opt/dcoco/models/tiny/dcoco",
    "DCOCO_PRECISION": "fp32",  # exact: a resumed greedy stream equals its single answer
    "DCOCO_MAX_MODEL_LEN": "512",
    "DCOCO_MAX_BATCH_SIZE": "8",
    "DCOCO_HEARTBEAT_S": "0.5",
}
LEASE = {"DCOCO_LEASE_S": "2"}  # gateway and workers agree on it
HELLO = [{"role": "user", "content": "def add(a, b):"}]
READY_S = 300  # a worker loads its model in seconds; the margin is for a busy machine


@dataclass
class Stack:
    network: str
    redis: Container
    workers: dict[str, Container]
    gateway: Container

    def containers(self) -> list[Container]:
        return [self.redis, *self.workers.values(), self.gateway]

    def client(self) -> openai.OpenAI:
        base = self.gateway.url(8000) + "/v1"
        return openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)


def keep_logs(containers: list[Container]) -> None:
    LOGS.mkdir(parents=True, exist_ok=True)
    for container in containers:
        (LOGS / f"{container.name}.log").write_text(container.logs())


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    shutil.rmtree(LOGS, ignore_errors=True)
    network = f"{PREFIX}-net"
    podman("network", "create", network)
    started: list[Container] = []
    try:
        store = Container(
            f"{PREFIX}-redis",
            REDIS,
            network,
            ports=(6379,),
            options=(*LOCKED_DOWN, "--user=redis", "--tmpfs=/data:rw,U"),
            command=("redis-server", "--appendonly", "yes"),
        )
        started.append(store.start())
        url = {"DCOCO_REDIS_URL": f"redis://{store.name}:6379/0"}
        workers = {}
        for worker_id in ("a", "b"):
            env = TINY | LEASE | url | {"DCOCO_WORKER_ID": worker_id}
            worker = Container(f"{PREFIX}-worker-{worker_id}", WORKER, network, env, (9400,))
            workers[worker_id] = worker
            started.append(worker.start())
        gateway = Container(f"{PREFIX}-gateway", GATEWAY, network, LEASE | url, ports=(8000,))
        started.append(gateway.start())
        for worker in workers.values():
            ready = worker.url(9400) + "/readyz"
            wait_until(lambda ready=ready: http_status(ready) == 200, READY_S, worker.name)
        wait_until(lambda: http_status(gateway.url(8000) + "/readyz") == 200, 60, "the gateway")
        yield Stack(network, store, workers, gateway)
    finally:
        keep_logs(started)
        for container in started:
            container.remove()
        podman("network", "rm", "--force", network, check=False)


def smoke(client: openai.OpenAI) -> None:
    """What a deployment must serve: its model, a chat completion with usage and speculation
    counts, the same answer streamed, a text completion streamed and not, OpenAI's errors."""
    assert [m.id for m in client.models.list().data] == [MODEL]
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=24, temperature=0
    )
    answer = reply.choices[0].message.content or ""
    assert answer
    assert reply.choices[0].finish_reason in ("length", "stop")
    assert reply.usage is not None
    assert 1 <= reply.usage.completion_tokens <= 24
    details = reply.usage.completion_tokens_details
    assert details is not None
    assert (details.accepted_prediction_tokens or 0) + (details.rejected_prediction_tokens or 0)
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == answer
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    whole = client.completions.create(model=MODEL, prompt="x = [", max_tokens=12, temperature=0)
    streamed = client.completions.create(
        model=MODEL, prompt="x = [", max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HELLO)
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=HELLO, logprobs=True)
    assert refused.value.param == "logprobs"


def test_every_container_runs_non_root_on_a_read_only_root_filesystem(stack: Stack) -> None:
    for image in (GATEWAY, WORKER):
        assert podman("image", "inspect", "--format={{.Config.User}}", image) == "10001"
    for container in stack.containers():
        assert container.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true", container.name
        uid = container.exec("id", "-u").stdout.strip()
        assert uid.isdigit(), (container.name, uid)
        assert uid != "0", container.name
        written = container.exec("touch", "/written")
        assert "Read-only file system" in written.stderr, (container.name, written.stderr)
    for container in (stack.gateway, *stack.workers.values()):
        assert container.exec("id", "-u").stdout.strip() == "10001"


def test_the_worker_image_holds_the_cpu_build_of_torch_and_the_gateway_none(
    stack: Stack,
) -> None:
    listed = stack.workers["a"].exec("pip", "list", "--format=freeze").stdout.splitlines()
    assert "torch==2.13.0+cpu" in listed
    assert not [p for p in listed if p.startswith(("nvidia-", "triton", "vllm"))]
    listed = stack.gateway.exec("pip", "list", "--format=freeze").stdout.splitlines()
    assert not [p for p in listed if p.startswith(("torch", "vllm"))]
    assert any(p.startswith("dcoco==") for p in listed)


def test_the_openai_client_against_the_containers(stack: Stack) -> None:
    client = stack.client()
    smoke(client)

    def sample(seed: int) -> list[str]:
        reply = client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=16, temperature=1.0, seed=seed, n=2
        )
        return [c.message.content or "" for c in reply.choices]

    assert sample(7) == sample(7)  # seeded sampling reproduces, whichever worker runs it


class Follower(threading.Thread):
    """One greedy stream, read to its end in a thread."""

    def __init__(self, client: openai.OpenAI, prompt: str, max_tokens: int) -> None:
        super().__init__(daemon=True)
        self.client, self.prompt, self.max_tokens = client, prompt, max_tokens
        self.text, self.response_id = "", ""
        self.finish: str | None = None
        self.usage = False
        self.started = threading.Event()
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            for chunk in self.client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": self.prompt}],
                max_tokens=self.max_tokens,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            ):
                self.response_id = chunk.id
                self.usage = self.usage or chunk.usage is not None
                for choice in chunk.choices:
                    self.text += choice.delta.content or ""
                    self.finish = choice.finish_reason or self.finish
                    if self.text:
                        self.started.set()
        except openai.OpenAIError as failed:
            self.error = failed
        finally:
            self.started.set()


def test_a_worker_killed_mid_stream_loses_nothing(stack: Stack) -> None:
    """Eight greedy streams; once each has sent text, the worker owning most of them is
    SIGKILLed. The other reclaims them after the 2 s lease, and every stream ends as its own
    single request's answer, with a finish reason and usage."""
    client = stack.client()
    prompts = [f"def function_{i}(values):" for i in range(8)]
    max_tokens = 160
    answers = []
    for prompt in prompts:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=0,
        )
        answers.append(reply.choices[0].message.content or "")
    followers = [Follower(client, prompt, max_tokens) for prompt in prompts]
    for follower in followers:
        follower.start()
    for follower in followers:
        assert follower.started.wait(120), "a stream sent nothing"
    store = redis.Redis(port=int(stack.redis.url(6379).rsplit(":", 1)[1]), decode_responses=True)
    owners = [store.get(keys.owner(f"{f.response_id}-0")) for f in followers]
    victim = max(stack.workers, key=lambda w: owners.count(f"{w} 1"))
    stack.workers[victim].kill()
    for follower in followers:
        follower.join(300)
        assert not follower.is_alive(), "a stream hung"
    assert [f.error for f in followers] == [None] * len(followers)
    assert [f.text for f in followers] == answers
    assert all(f.finish in ("length", "stop") and f.usage for f in followers)
    # The streams the victim had not finished were taken over by the other worker, as their
    # second attempt: there must be some, or the kill did not happen mid-stream.
    survivor = next(w for w in stack.workers if w != victim)
    after = [store.get(keys.owner(f"{f.response_id}-0")) for f in followers]
    assert f"{survivor} 2" in after, (owners, after)
    assert set(after) <= {f"{victim} 1", f"{survivor} 1", f"{survivor} 2"}, after


def test_containers_that_cannot_reach_redis_stay_up_unready_and_say_why(stack: Stack) -> None:
    nowhere = {"DCOCO_REDIS_URL": "redis://no-such-redis:6379/0"}
    worker = Container(f"{PREFIX}-lost-worker", WORKER, stack.network, TINY | nowhere, (9400,))
    gateway = Container(f"{PREFIX}-lost-gateway", GATEWAY, stack.network, nowhere, (8000,))
    try:
        for container in (worker.start(), gateway.start()):
            said = lambda c=container: "Redis unavailable; retrying" in c.logs()  # noqa: E731
            wait_until(said, READY_S, f"{container.name} to log why")
            line = next(x for x in container.logs().splitlines() if "Redis unavailable" in x)
            assert "no-such-redis" in line, line
        assert http_status(worker.url(9400) + "/healthz") == 200  # alive: no restart loop
        assert http_status(worker.url(9400) + "/readyz") == 503
        assert http_status(gateway.url(8000) + "/healthz") == 200
        assert http_status(gateway.url(8000) + "/readyz") == 503
        assert worker.running()
        assert gateway.running()
    finally:
        keep_logs([worker, gateway])
        worker.remove()
        gateway.remove()


def test_a_worker_without_a_model_exits_naming_what_is_missing(stack: Stack) -> None:
    missing = TINY | {"DCOCO_TARGET": "/opt/dcoco/models/absent", "DCOCO_REDIS_URL": "redis://x"}
    worker = Container(f"{PREFIX}-empty-worker", WORKER, stack.network, missing, (9400,))
    try:
        worker.start()
        wait_until(lambda: not worker.running(), READY_S, "the worker without a model to exit")
        assert worker.exit_code() == 1
        last = worker.logs().strip().splitlines()[-1]
        assert last.startswith("dcoco worker: error: /opt/dcoco/models/absent/tokenizer.json")
        assert "Traceback" not in worker.logs()
    finally:
        keep_logs([worker])
        worker.remove()


def test_compose_comes_up_under_podman_compose_and_passes_the_smoke_test(
    tmp_path: Path,
) -> None:
    port = free_port()
    override = tmp_path / "compose.override.yaml"
    override.write_text(yaml.safe_dump({"services": {"worker": {"environment": TINY}}}))
    project = f"{PREFIX}-compose"
    compose = [
        str(Path(sys.executable).parent / "podman-compose"),
        f"--project-name={project}",
        f"--file={ROOT / 'docker' / 'compose.yaml'}",
        f"--file={override}",
    ]
    env = os.environ | {"DCOCO_GATEWAY_PORT": str(port)}
    names = [f"{project}_{service}_1" for service in ("redis", "worker", "gateway")]
    try:
        up = podman_compose(compose, env, "up", "--detach", "--no-build")
        assert up.returncode == 0, up.stderr[-3000:]
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_status(url + "/readyz") == 200, READY_S, "the compose stack")
        smoke(openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300))
        for name in names[1:]:
            container = Container(name, "", "")
            assert container.inspect("{{.HostConfig.ReadonlyRootfs}}") == "true", name
            assert container.exec("id", "-u").stdout.strip() == "10001", name
    finally:
        keep_logs([Container(name, "", "") for name in names])
        podman_compose(compose, env, "down", "--volumes")


def podman_compose(
    compose: list[str], env: dict[str, str], *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*compose, *args], env=env, capture_output=True, text=True, timeout=600, check=False
    )
