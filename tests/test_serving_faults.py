"""Faults, each against real processes: a worker killed mid-stream, Redis restarted under load,
a client that disconnects, a deadline that expires while the only worker is busy."""

import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import openai
import pytest

from factories import write_models
from stack import Stack, fetch, http_status, metric_values, owner_pid, wait_for

pytestmark = pytest.mark.slow
MODEL = Stack.MODEL


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_models(tmp_path_factory.mktemp("models"))


@pytest.fixture
def make_stack(tmp_path: Path, models: dict[str, Path]) -> Iterator[type[Stack]]:
    made: list[Stack] = []

    def build(**env: str) -> Stack:
        stack = Stack(tmp_path, models, **env)
        made.append(stack)
        return stack

    yield build  # type: ignore[misc]
    for stack in made:
        stack.stop()


def client_for(stack: Stack, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=timeout
    )


def chat(content: str, **params: object) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": content}]} | params


def test_a_killed_worker_s_requests_finish_on_another_exactly_once(make_stack: type[Stack]) -> None:
    # Vanilla decoding and long answers, so the kill always lands mid-generation.
    stack = make_stack(DCOCO_MODE="vanilla", DCOCO_MAX_MODEL_LEN="4096").start(workers=2)  # type: ignore[call-arg]
    check_kill_and_reclaim(stack, client_for(stack), max_tokens=800, within_s=20)


def check_kill_and_reclaim(
    stack: Stack,
    client: openai.OpenAI,
    max_tokens: int,
    within_s: float,
    after_kill: Callable[[], object] = lambda: None,
) -> None:
    """SIGKILLs the worker that owns a greedy, a seeded and an unseeded stream; a live worker
    (already running, or started by `after_kill`) reclaims them and each stream continues
    exactly once, within `within_s` of the kill."""
    cases = {
        "greedy": chat("def add(a, b):", max_tokens=max_tokens, temperature=0),
        "seeded": chat("x = [", max_tokens=max_tokens, temperature=1.0, seed=7),
    }
    expected = {
        name: client.chat.completions.create(**body).choices[0].message.content
        for name, body in cases.items()
    }  # type: ignore[call-overload]
    cases["unseeded"] = chat("The cat", max_tokens=max_tokens, temperature=1.0)
    streams = {
        name: client.chat.completions.create(stream=True, **body) for name, body in cases.items()
    }  # type: ignore[call-overload]
    texts = {name: "" for name in cases}
    finish = {}
    first = {name: next(iter(s)) for name, s in streams.items()}  # every request is running
    victim = owner_pid(stack.redis, first["greedy"].id)
    assert victim is not None
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    after_kill()
    for name, stream in streams.items():
        for chunk in stream:
            for choice in chunk.choices:
                texts[name] += choice.delta.content or ""
                finish[name] = choice.finish_reason or finish.get(name)
    assert time.monotonic() - killed_at < within_s
    assert texts["greedy"] == expected["greedy"]  # continued exactly, nothing lost or repeated
    assert texts["seeded"] == expected["seeded"]
    assert finish == dict.fromkeys(cases, "length") or "stop" in finish.values()
    survivor = next(w for w in stack.workers if w.alive())
    assert "reclaimed" in survivor.log.read_text()


def test_redis_restart_under_load(make_stack: type[Stack]) -> None:
    stack = make_stack().start()  # type: ignore[call-arg]
    client = client_for(stack, timeout=30)
    outcomes: list[str] = []

    def long_stream() -> None:
        try:
            for _ in client.chat.completions.create(
                stream=True, **chat("go", max_tokens=480, temperature=0)
            ):  # type: ignore[call-overload]
                time.sleep(0.01)
            outcomes.append("finished")
        except (openai.APIError, httpx.HTTPError) as problem:
            outcomes.append(type(problem).__name__)

    threads = [threading.Thread(target=long_stream) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    stack.redis.stop()
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(**chat("hi", max_tokens=4))  # type: ignore[call-overload]
    assert refused.value.status_code == 503
    assert time.monotonic() - started < 2.0
    assert http_status(f"{stack.url}/readyz") == 503
    for thread in threads:
        thread.join(timeout=20)
    assert len(outcomes) == 4  # every in-flight stream ended (finished or a clear error), no hang
    stack.redis.start()
    wait_for(lambda: http_status(f"{stack.url}/readyz") == 200, timeout=30, what="recovery")
    reply = client.chat.completions.create(**chat("hi again", max_tokens=8, temperature=0))  # type: ignore[call-overload]
    assert reply.choices[0].finish_reason in ("length", "stop")


def test_a_disconnected_client_aborts_the_engine_request(make_stack: type[Stack]) -> None:
    # Vanilla decoding and a long answer: slow enough that the client leaves mid-generation.
    stack = make_stack(DCOCO_MODE="vanilla", DCOCO_MAX_MODEL_LEN="4096").start()  # type: ignore[call-arg]
    check_disconnect_aborts(stack, max_tokens=4000)


def check_disconnect_aborts(stack: Stack, max_tokens: int) -> None:
    """A client that closes its stream mid-generation gets its engine request aborted."""
    worker_metrics = f"http://127.0.0.1:{stack.metrics_ports[-1]}/metrics"
    aborts = f'dcoco_worker_requests_total{{model="{MODEL}",outcome="abort"}}'
    generated = f'dcoco_generation_tokens_total{{model="{MODEL}"}}'
    before = metric_values(fetch(worker_metrics))
    body = chat("go", max_tokens=max_tokens, temperature=0, stream=True)
    with httpx.stream("POST", f"{stack.url}/v1/chat/completions", json=body, timeout=30) as reply:
        lines = reply.iter_lines()
        for _ in range(6):
            next(lines)
    # the connection is closed here, mid-stream

    def aborted() -> bool:
        return metric_values(fetch(worker_metrics)).get(aborts, 0) == before.get(aborts, 0) + 1

    wait_for(aborted, timeout=10, what="the abort")
    values = metric_values(fetch(worker_metrics))
    latency = values[f'dcoco_cancel_latency_seconds_sum{{model="{MODEL}"}}'] - before.get(
        f'dcoco_cancel_latency_seconds_sum{{model="{MODEL}"}}', 0
    )
    assert 0 < latency < 1.0  # disconnect seen by the gateway -> engine abort
    assert values[generated] - before.get(generated, 0) < max_tokens


def test_a_request_past_its_deadline_is_not_run(make_stack: type[Stack]) -> None:
    stack = make_stack(DCOCO_QUEUE_TIMEOUT_S="1", DCOCO_MAX_MODEL_LEN="2048").start(
        DCOCO_MAX_BATCH_SIZE="1"
    )  # type: ignore[call-arg]
    client = client_for(stack)
    busy = threading.Thread(
        target=lambda: client.chat.completions.create(**chat("go", max_tokens=2000, temperature=0))
    )  # type: ignore[call-overload]
    busy.start()
    time.sleep(0.5)
    started = time.monotonic()
    with pytest.raises(openai.APIStatusError) as late:
        client.chat.completions.create(**chat("me too", max_tokens=4))  # type: ignore[call-overload]
    assert late.value.status_code == 504
    assert late.value.code == "queue_timeout"
    assert time.monotonic() - started < 6
    busy.join(timeout=60)
    values = metric_values(fetch(f"http://127.0.0.1:{stack.metrics_ports[0]}/metrics"))
    ran = sum(
        v
        for k, v in values.items()
        if k.startswith("dcoco_worker_requests_total") and 'outcome="length"' in k
    )
    assert ran == 1  # only the first request generated anything


def test_sigterm_drains_then_hands_back_what_is_left(make_stack: type[Stack]) -> None:
    """A worker told to stop finishes what it can within its drain timeout, hands the rest back
    to the stream, deregisters and exits 0; another worker completes the handed-back requests."""
    stack = make_stack(DCOCO_MODE="vanilla", DCOCO_MAX_MODEL_LEN="4096").start(  # type: ignore[call-arg]
        workers=2, DCOCO_DRAIN_TIMEOUT_S="0.3"
    )
    client = client_for(stack)
    short = chat("short", max_tokens=8, temperature=0)
    long = chat("long", max_tokens=3000, temperature=0)
    expected_long = client.chat.completions.create(**long).choices[0].message.content  # type: ignore[call-overload]
    stream = client.chat.completions.create(stream=True, **long)  # type: ignore[call-overload]
    first = next(iter(stream))
    victim_pid = owner_pid(stack.redis, first.id)
    assert victim_pid is not None
    victim = next(w for w in stack.workers if w.pid == victim_pid)
    victim.signal(signal.SIGTERM)
    text = first.choices[0].delta.content or ""
    for chunk in stream:
        text += "".join(c.delta.content or "" for c in chunk.choices)
    assert text == expected_long  # handed back mid-stream, continued exactly elsewhere
    assert victim.process is not None
    assert victim.process.wait(timeout=30) == 0
    workers_left = stack.redis.client().zrange(f"dcoco:{MODEL}:workers", 0, -1)
    assert not any(w.endswith(f"-{victim_pid}") for w in workers_left)  # deregistered
    assert client.chat.completions.create(**short).choices[0].finish_reason == "length"
