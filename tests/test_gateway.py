"""The gateway on its own, in-process (httpx.ASGITransport) against a real redis-server, with a
model card published but no worker: admission, limits, deadlines and outages."""

import asyncio
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from dcoco.gateway.app import create_app
from dcoco.queue.connection import connect
from dcoco.queue.consumer import WorkerQueue
from dcoco.queue.protocol import ModelCard
from dcoco.settings import GatewaySettings
from dcoco.tokenizer import Tokenizer, save_tokenizer, train_tokenizer
from stack import RedisServer

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_tokenizer(["hello world"] * 10, vocab_size=280), folder)
    return folder


@pytest.fixture
def published(redis_server: RedisServer, tokenizer_dir: Path) -> None:
    """Model "m" is known (card and tokenizer in Redis), and no worker consumes its queue."""
    redis_server.client().flushall()
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    card = ModelCard(
        name="m",
        max_model_len=64,
        tokenizer_sha="abc",
        chat_template=tokenizer.chat_template,
        created=0,
    )

    async def register() -> None:
        client = connect(redis_server.url)
        await WorkerQueue(client, client, "m", "nobody", 10).register(
            card, (tokenizer_dir / "tokenizer.json").read_text()
        )
        await client.aclose()

    asyncio.run(register())
    return


def gateway(redis_server: RedisServer, **overrides: object) -> httpx.AsyncClient:
    settings = GatewaySettings(redis_url=redis_server.url, **overrides)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=create_app(settings))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30)


@pytest.fixture
async def plain(redis_server: RedisServer, published: None) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway(redis_server, queue_timeout_s=0.5) as client:
        yield client


def test_the_gateway_never_imports_torch() -> None:
    probe = (
        "import sys\n"
        "from dcoco.cli import build_parser\n"
        "build_parser().parse_args(['gateway'])\n"
        "from dcoco.gateway.app import create_app\n"
        "from dcoco.settings import GatewaySettings\n"
        "create_app(GatewaySettings())\n"
        "heavy = [m for m in ('torch', 'vllm', 'transformers') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, timeout=60)


async def test_an_unclaimed_request_times_out_with_a_clear_error(plain: httpx.AsyncClient) -> None:
    started = time.monotonic()
    reply = await plain.post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 504
    assert reply.json()["error"]["code"] == "queue_timeout"
    assert time.monotonic() - started < 5


async def test_a_full_queue_answers_429_before_any_work(
    redis_server: RedisServer, published: None
) -> None:
    async with gateway(redis_server, queue_timeout_s=3, max_queue_depth=2) as client:
        waiting = [
            asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)) for _ in range(2)
        ]
        await asyncio.sleep(0.3)
        assert redis_server.client().xlen("dcoco:m:requests") == 2
        full = await client.post("/v1/chat/completions", json=CHAT)
        assert full.status_code == 429
        assert full.headers["retry-after"] == "1"
        assert full.json()["error"]["code"] == "queue_full"
        assert redis_server.client().xlen("dcoco:m:requests") == 2  # nothing was queued
        n_too_many = await client.post("/v1/chat/completions", json=CHAT | {"n": 3})
        assert n_too_many.status_code == 429  # all of a request's choices fit, or none
        await asyncio.gather(*waiting)


async def test_api_keys(redis_server: RedisServer, published: None, tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# mounted secret\nfile-key\n")
    async with gateway(redis_server, api_keys="k1,k2", api_keys_file=key_file) as client:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic k1"}):
            reply = await client.get("/v1/models", headers=headers)
            assert reply.status_code == 401
            assert reply.json()["error"]["code"] == "invalid_api_key"
        for key in ("k1", "k2", "file-key"):
            assert (
                await client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            ).status_code == 200
        assert (await client.get("/healthz")).status_code == 200  # probes need no key


async def test_per_key_rate_limit(redis_server: RedisServer, published: None) -> None:
    async with gateway(
        redis_server, api_keys="k1,k2", rate_limit_rpm=60, rate_limit_burst=2
    ) as client:
        bad = CHAT | {"temperature": 9}  # refused after admission, cheaply

        async def send(key: str) -> httpx.Response:
            return await client.post(
                "/v1/chat/completions", json=bad, headers={"Authorization": f"Bearer {key}"}
            )

        assert [(await send("k1")).status_code for _ in range(2)] == [400, 400]
        limited = await send("k1")
        assert limited.status_code == 429
        assert limited.json()["error"]["code"] == "rate_limit_exceeded"
        assert 1 <= int(limited.headers["retry-after"]) <= 2
        assert (await send("k2")).status_code == 400  # another key has its own budget


async def test_per_key_concurrency_limit(redis_server: RedisServer, published: None) -> None:
    async with gateway(
        redis_server, api_keys="k1", max_concurrent_per_key=1, queue_timeout_s=1
    ) as client:
        auth = {"Authorization": "Bearer k1"}
        first = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT, headers=auth))
        await asyncio.sleep(0.3)
        second = await client.post("/v1/chat/completions", json=CHAT, headers=auth)
        assert second.status_code == 429
        assert second.json()["error"]["code"] == "concurrency_limit_exceeded"
        assert (await first).status_code == 504
        third = await client.post("/v1/chat/completions", json=CHAT, headers=auth)
        assert third.status_code == 504  # the slot was released


async def test_redis_outage_is_a_fast_503(tmp_path: Path) -> None:
    dead = RedisServer(tmp_path)
    dead.stop()
    async with gateway(dead) as client:
        started = time.monotonic()
        reply = await client.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "queue_unavailable"
        assert time.monotonic() - started < 1.5
        assert (await client.get("/readyz")).status_code == 503
        assert (await client.get("/healthz")).status_code == 200


async def test_readiness_needs_a_live_worker(plain: httpx.AsyncClient) -> None:
    reply = await plain.get("/readyz")
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == "no_workers"
