"""Scale from zero, as far as one machine allows: with no worker running, requests wait in their
model's Redis stream (no 503); the consumer-group lag that the chart's KEDA trigger reads rises,
measured with KEDA's own arithmetic; when a worker starts, every waiting request completes.

KEDA's redis-streams scaler in lag mode (a consumer group plus lagCount) reads the `lag` field of
XINFO GROUPS for the group (Redis 7 or later); a stream that does not exist reads 0, a group that
does not exist reads XLEN. It activates the ScaledObject (0 -> 1) when the value is strictly
greater than activationLagCount, and asks for ceil(lag / lagCount) replicas.
"""

import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from factories import write_models
from stack import Stack, http_status, wait_for, worker_ids

pytestmark = pytest.mark.slow
STREAM, GROUP = f"dcoco:{Stack.MODEL}:requests", "workers"
WAITING = 6
ACTIVATION_LAG_COUNT, LAG_COUNT = 0, 4  # as a values file would set them


def keda_lag(client: "redis.Redis[str]") -> int:
    """The value KEDA's lag mode computes, NULL lag refused (KEDA would read it as 0)."""
    version = int(str(client.info("server")["redis_version"]).split(".")[0])
    assert version >= 7, "lag mode needs Redis 7 (XINFO GROUPS lag): install Debian's redis-server"
    if not client.exists(STREAM):
        return 0
    for group in client.xinfo_groups(STREAM):
        if group["name"] == GROUP:
            lag = group["lag"]
            assert lag is not None, f"Redis cannot compute the lag: {group}"
            return int(lag)
    return int(client.xlen(STREAM))


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    models = write_models(tmp_path_factory.mktemp("models"), distilled=False)
    running = Stack(
        tmp_path_factory.mktemp("stack"),
        models,
        DCOCO_QUEUE_TIMEOUT_S="60",  # outlasts the cold start, as the chart arranges
        DCOCO_READYZ_REQUIRES_WORKERS="false",  # as the chart sets when a model scales to zero
    )
    yield running.start()
    running.stop()


def ask(url: str, index: int, results: dict[int, tuple[int, str]]) -> None:
    body = {
        "model": Stack.MODEL,
        "messages": [{"role": "user", "content": f"def add(a, b):  # {index}"}],
        "max_tokens": 16,
        "temperature": 0,
    }
    with httpx.Client(timeout=90) as client:
        reply = client.post(f"{url}/v1/chat/completions", json=body)
    results[index] = (reply.status_code, reply.text)


def test_requests_wait_at_zero_workers_and_complete_when_one_starts(stack: Stack) -> None:
    client = stack.redis.client()
    # A first worker served once (so the gateway knows the model), then scaled down to zero.
    results: dict[int, tuple[int, str]] = {}
    ask(stack.url, -1, results)
    assert results.pop(-1)[0] == 200
    assert stack.workers[0].stop() == 0
    wait_for(lambda: worker_ids(stack.redis, Stack.MODEL) == [], 30, "zero workers")
    assert keda_lag(client) == 0
    assert http_status(f"{stack.url}/readyz") == 200  # the gateway stays in its Service

    threads = [threading.Thread(target=ask, args=(stack.url, i, results)) for i in range(WAITING)]
    for thread in threads:
        thread.start()
    wait_for(lambda: keda_lag(client) == WAITING, 20, f"a lag of {WAITING}")
    # Pending-entries mode would see nothing here: no consumer has read the entries.
    assert client.xpending(STREAM, GROUP)["pending"] == 0
    assert keda_lag(client) > ACTIVATION_LAG_COUNT  # KEDA activates the ScaledObject
    assert math.ceil(keda_lag(client) / LAG_COUNT) == 2  # and asks for two workers
    time.sleep(2)
    assert results == {}, results  # nobody was answered: no 503, no 429, they wait
    assert all(thread.is_alive() for thread in threads)

    started = time.monotonic()
    stack.add_worker()
    for thread in threads:
        thread.join(timeout=90)
    cold_start = time.monotonic() - started
    assert sorted(results) == list(range(WAITING))
    for status, text in results.values():
        assert status == 200, text
        assert '"finish_reason"' in text
        assert "error" not in text
    assert keda_lag(client) == 0
    assert client.xpending(STREAM, GROUP)["pending"] == 0
    print(f"{WAITING} requests waited at zero workers; served {cold_start:.1f} s after start")


def test_a_model_that_never_had_a_worker_is_registered_and_waits_for_its_first(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The chart's registration job (`dcoco worker --register-only`) before any worker ran: the
    gateway knows the model, queues its requests, and the first worker serves them."""
    models = write_models(tmp_path_factory.mktemp("models"), distilled=False)
    stack = Stack(
        tmp_path_factory.mktemp("never"),
        models,
        DCOCO_QUEUE_TIMEOUT_S="60",
        DCOCO_READYZ_REQUIRES_WORKERS="false",
    )
    try:
        stack.gateway.start()
        wait_for(lambda: http_status(f"{stack.url}/readyz") == 200, what="the gateway")
        register = subprocess.run(
            [sys.executable, "-m", "dcoco", "worker", "--register-only"],
            env=stack.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert register.returncode == 0, register.stderr
        assert worker_ids(stack.redis, Stack.MODEL) == []  # registered, but nobody serves
        results: dict[int, tuple[int, str]] = {}
        waiting = threading.Thread(target=ask, args=(stack.url, 0, results))
        waiting.start()
        wait_for(lambda: keda_lag(stack.redis.client()) == 1, 20, "the request in the stream")
        stack.add_worker()
        waiting.join(timeout=90)
        status, text = results[0]
        assert status == 200, text
        assert '"finish_reason"' in text
    finally:
        stack.stop()


def test_registering_without_redis_is_one_line(tmp_path: Path) -> None:
    models = write_models(tmp_path, distilled=False)
    env = dict(os.environ) | {
        "DCOCO_REDIS_URL": "redis://127.0.0.1:1/0",
        "DCOCO_TARGET": str(models["target"]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "dcoco", "worker", "--register-only"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("dcoco worker: error: Redis is unreachable")
    assert "Traceback" not in done.stderr
