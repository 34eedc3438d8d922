"""The gateway on its own, in-process (httpx.ASGITransport) against a real redis-server, with a
model card published but no worker: admission, limits, deadlines and outages."""

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import jsonschema
import pytest

from dcoco.gateway.app import create_app
from dcoco.gateway.guard import key_id
from dcoco.gateway.jobs import GUARD_S, START_GRACE_S
from dcoco.queue import keys
from dcoco.queue.connection import connect
from dcoco.queue.consumer import WorkerQueue
from dcoco.queue.protocol import Envelope, ModelCard
from dcoco.serve import free_port
from dcoco.settings import GatewaySettings
from dcoco.tokenizer import Tokenizer, save_tokenizer, train_tokenizer
from stack import RedisServer, Service, http_status, wait_for

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
QUEUE_TIMEOUT_S = 0.5


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_tokenizer(["hello world"] * 10, vocab_size=280), folder)
    return folder


@pytest.fixture
def published(redis_server: RedisServer, tokenizer_dir: Path) -> None:
    """Model "m" is known (card and tokenizer in Redis), and no worker consumes its queue."""
    redis_server.client().flushall()
    publish(redis_server, tokenizer_dir)


def publish(redis_server: RedisServer, tokenizer_dir: Path) -> None:
    asyncio.run(register(redis_server, tokenizer_dir))


async def register(redis_server: RedisServer, tokenizer_dir: Path) -> None:
    """Publishes model "m" as its worker does."""
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    card = ModelCard(
        name="m",
        max_model_len=64,
        tokenizer_sha="abc",
        chat_template=tokenizer.chat_template,
        created=0,
    )
    client = connect(redis_server.url)
    await WorkerQueue(client, client, "m", "nobody", 10).register(
        card, (tokenizer_dir / "tokenizer.json").read_text()
    )
    await client.aclose()


def gateway(redis_server: RedisServer, **overrides: object) -> httpx.AsyncClient:
    settings = GatewaySettings(redis_url=redis_server.url, **overrides)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=create_app(settings))
    return httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30)


@pytest.fixture
async def plain(redis_server: RedisServer, published: None) -> AsyncIterator[httpx.AsyncClient]:
    async with gateway(redis_server, queue_timeout_s=QUEUE_TIMEOUT_S) as client:
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
    took = time.monotonic() - started
    assert reply.status_code == 504
    assert reply.json()["error"]["code"] == "queue_timeout"
    # It waited for the queue deadline, and gave up on the gateway's own limits (the reader's,
    # then the merged wait's guard), long before the client's 30 s.
    assert QUEUE_TIMEOUT_S <= took < QUEUE_TIMEOUT_S + START_GRACE_S + GUARD_S


async def test_a_full_queue_answers_429_before_any_work(
    redis_server: RedisServer, published: None
) -> None:
    async with gateway(redis_server, queue_timeout_s=3, max_queue_depth=3) as client:
        waiting = [
            asyncio.create_task(client.post("/v1/chat/completions", json=CHAT)) for _ in range(3)
        ]
        await until(lambda: redis_server.client().xlen("dcoco:m:requests") == 3)
        full = await client.post("/v1/chat/completions", json=CHAT)
        assert full.status_code == 429
        assert full.headers["retry-after"] == "1"
        assert full.json()["error"]["code"] == "queue_full"
        assert redis_server.client().xlen("dcoco:m:requests") == 3  # nothing was queued
        n_too_many = await client.post("/v1/chat/completions", json=CHAT | {"n": 2})
        assert n_too_many.status_code == 429  # all of a request's choices fit, or none
        await asyncio.gather(*waiting)


async def test_a_request_larger_than_the_whole_queue_is_a_400_not_a_retryable_429(
    redis_server: RedisServer, published: None
) -> None:
    async with gateway(redis_server, queue_timeout_s=3, max_queue_depth=16) as client:
        completion = {"model": "m", "prompt": ["a"] * 3, "n": 6, "max_tokens": 1}
        reply = await client.post("/v1/completions", json=completion)
        assert reply.status_code == 400, reply.text  # on an idle server: it can never fit
        assert "retry-after" not in reply.headers
        error = reply.json()["error"]
        assert "18 generations" in error["message"]
        assert "16" in error["message"]
        assert error["param"] == "prompt"
        chat = await client.post("/v1/chat/completions", json=CHAT | {"n": 8, "max_tokens": 1})
        assert chat.status_code == 504  # 8 fit: queued, and no worker took it up
        assert redis_server.client().xlen("dcoco:m:requests") == 8


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
        await until(lambda: redis_server.client().zcard(keys.active(key_id("k1"))) == 1)
        second = await client.post("/v1/chat/completions", json=CHAT, headers=auth)
        assert second.status_code == 429
        assert second.json()["error"]["code"] == "concurrency_limit_exceeded"
        assert (await first).status_code == 504
        third = await client.post("/v1/chat/completions", json=CHAT, headers=auth)
        assert third.status_code == 504  # the slot was released


def test_a_stream_holds_its_keys_slot_until_it_ends(
    redis_server: RedisServer, published: None, tmp_path: Path
) -> None:
    """The slot is released once the response has been sent, a whole stream included (a real
    gateway process: the in-process transport would read the whole stream first)."""
    port = free_port()
    env = {
        "DCOCO_REDIS_URL": redis_server.url,
        "DCOCO_PORT": str(port),
        "DCOCO_API_KEYS": "k1",
        "DCOCO_MAX_CONCURRENT_PER_KEY": "1",
        "DCOCO_QUEUE_TIMEOUT_S": "2",
        "DCOCO_SSE_KEEPALIVE_S": "0.2",
    }
    process = Service("gateway", env, tmp_path / "gateway.log").start()
    url = f"http://127.0.0.1:{port}"
    auth = {"Authorization": "Bearer k1"}
    try:
        wait_for(lambda: http_status(f"{url}/healthz") == 200, what="the gateway")
        body = CHAT | {"stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=auth) as r:
            assert r.status_code == 200  # keep-alives while it waits in the queue
            second = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=auth)
            assert second.status_code == 429, second.text
            assert second.json()["error"]["code"] == "concurrency_limit_exceeded"
            lines = [line for line in r.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        active = keys.active(key_id("k1"))
        wait_for(lambda: redis_server.client().zcard(active) == 0, 10, "the slot's release")
        third = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=auth, timeout=30)
        assert third.status_code == 504  # admitted again; no worker took it up
    finally:
        process.stop()


async def test_redis_outage_is_a_fast_503(tmp_path: Path) -> None:
    dead = RedisServer(tmp_path)
    dead.stop()
    queue_timeout_s = 30.0
    async with gateway(dead, queue_timeout_s=queue_timeout_s) as client:
        started = time.monotonic()
        reply = await client.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "queue_unavailable"
        # Answered at once, not after waiting on the queue (30 s) or the client's timeout.
        assert time.monotonic() - started < queue_timeout_s / 10
        assert (await client.get("/readyz")).status_code == 503
        assert (await client.get("/healthz")).status_code == 200


async def test_a_request_abandoned_while_redis_is_down_is_cancelled_once_it_is_back(
    tmp_path: Path, tokenizer_dir: Path
) -> None:
    """Redis comes back with its data (AOF): the request's entry is there for a worker to take,
    and the gateway, which answered 503, must still get the cancel flag to it."""
    server = RedisServer(tmp_path, appendonly=True)
    try:
        await asyncio.to_thread(publish, server, tokenizer_dir)
        async with gateway(server, queue_timeout_s=30) as client:
            waiting = asyncio.create_task(client.post("/v1/chat/completions", json=CHAT))
            await until(lambda: server.client().xlen("dcoco:m:requests") == 1)
            server.stop()
            reply = await waiting
            assert reply.status_code == 503
            assert reply.json()["error"]["code"] == "queue_unavailable"
            server.start()
            [(_, fields)] = server.client().xrange("dcoco:m:requests")
            request_id = Envelope.model_validate_json(fields["r"]).id
            await until(lambda: server.client().exists(keys.cancel(request_id)) == 1)
    finally:
        server.stop()


async def until(condition: Callable[[], bool], timeout_s: float = 15) -> None:
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.05)


async def test_readiness_needs_a_live_worker(plain: httpx.AsyncClient) -> None:
    reply = await plain.get("/readyz")
    assert reply.status_code == 503
    assert reply.json()["error"]["code"] == "no_workers"


def raw_post(client: httpx.AsyncClient, path: str, body: bytes) -> "asyncio.Future[httpx.Response]":
    headers = {"Content-Type": "application/json"}
    return asyncio.ensure_future(client.post(path, content=body, headers=headers))


BAD_BODIES = {
    "deeply nested JSON": (
        "/v1/chat/completions",
        b'{"model": "m", "messages": ' + b"[" * 2000 + b"]" * 2000 + b"}",
    ),
    "lone surrogate in content": (
        "/v1/chat/completions",
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
    ),
    "lone surrogate in a prompt": ("/v1/completions", b'{"model": "m", "prompt": "a\\ud800"}'),
    "lone surrogate in a stop string": (
        "/v1/completions",
        b'{"model": "m", "prompt": "a", "stop": ["\\udfff"]}',
    ),
    "empty prompt list": ("/v1/completions", b'{"model": "m", "prompt": []}'),
    "max_tokens as a string": (
        "/v1/completions",
        b'{"model": "m", "prompt": "a", "max_tokens": "4"}',
    ),
    "stream as a string": ("/v1/completions", b'{"model": "m", "prompt": "a", "stream": "yes"}'),
    "stream as a number": ("/v1/completions", b'{"model": "m", "prompt": "a", "stream": 0}'),
    "booleans as token ids": ("/v1/completions", b'{"model": "m", "prompt": [[false]]}'),
    "invalid UTF-8": ("/v1/completions", b'{"model": "m", "prompt": "\xff\xfe"}'),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
async def test_malformed_and_hostile_bodies_are_400_in_the_envelope(
    plain: httpx.AsyncClient, case: str
) -> None:
    path, body = BAD_BODIES[case]
    reply = await raw_post(plain, path, body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"


async def test_a_wrong_method_is_a_405_invalid_request(plain: httpx.AsyncClient) -> None:
    reply = await plain.get("/v1/chat/completions")
    assert reply.status_code == 405
    assert reply.json()["error"]["type"] == "invalid_request_error"


async def test_an_unrelated_os_error_is_a_500_not_a_queue_outage(
    redis_server: RedisServer, published: None
) -> None:
    app = create_app(GatewaySettings(redis_url=redis_server.url))

    async def broken(name: str) -> object:
        raise FileNotFoundError("/nowhere")

    app.state.services.catalog.get = broken
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        reply = await client.post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 500
    assert reply.json()["error"] == {
        "message": "internal error",
        "type": "server_error",
        "param": None,
        "code": "internal_error",
    }


async def test_a_model_that_vanished_with_redis_is_unavailable_not_unknown(
    redis_server: RedisServer, published: None
) -> None:
    async with gateway(redis_server, queue_timeout_s=0.5) as client:
        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["m"]
        redis_server.client().flushall()  # Redis restarted empty; no worker re-registered yet
        async with asyncio.timeout(15):  # until the catalog has refreshed (every 2 s)
            while (await client.get("/v1/models")).json()["data"]:
                await asyncio.sleep(0.1)
        reply = await client.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 503
        assert reply.json()["error"]["code"] == "model_unavailable"
        assert int(reply.headers["retry-after"]) >= 1
        unknown = await client.post("/v1/chat/completions", json=CHAT | {"model": "never-seen"})
        assert unknown.status_code == 404


async def test_a_stream_waiting_in_the_queue_gets_keep_alives_then_a_timeout_event(
    redis_server: RedisServer, published: None
) -> None:
    keepalive_s = 0.2
    started = time.monotonic()
    async with (
        gateway(redis_server, queue_timeout_s=1.0, sse_keepalive_s=keepalive_s) as client,
        client.stream("POST", "/v1/chat/completions", json=CHAT | {"stream": True}) as reply,
    ):
        assert reply.status_code == 200  # committed to the stream after one keep-alive
        lines = [line async for line in reply.aiter_lines() if line]
    waited = time.monotonic() - started
    # One ping per keep-alive interval of the wait; half as many leaves room for a busy loop.
    assert lines.count(": ping") >= max(1, int(waited / keepalive_s / 2))
    assert '"code":"queue_timeout"' in lines[-2]
    assert lines[-1] == "data: [DONE]"


async def test_readiness_can_ignore_workers_for_scale_to_zero(
    redis_server: RedisServer, published: None
) -> None:
    async with gateway(redis_server, readyz_requires_workers=False) as client:
        reply = await client.get("/readyz")
    assert reply.status_code == 200
    assert reply.json()["workers"] == {"m": 0}


async def test_a_gateway_whose_background_loop_gave_up_is_not_live(
    redis_server: RedisServer,
) -> None:
    settings = GatewaySettings(redis_url=redis_server.url)
    app = create_app(settings)
    app.state.services.broken = True
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
        reply = await client.get("/healthz")
    assert reply.status_code == 503  # the orchestrator restarts it
    assert reply.json()["error"]["code"] == "broken"


def test_the_openapi_schema_documents_the_request_bodies(redis_server: RedisServer) -> None:
    schema = create_app(GatewaySettings(redis_url=redis_server.url)).openapi()
    for path, model in (
        ("/v1/chat/completions", "ChatRequest"),
        ("/v1/completions", "CompletionRequest"),
    ):
        operation = schema["paths"][path]["post"]
        body = operation["requestBody"]["content"]["application/json"]["schema"]
        assert body["title"] == model
        assert body["additionalProperties"] is False
        assert {"speculation", "provenance", "rejected_drafts"} <= set(body["properties"])
        assert "400" in operation["responses"]
        assert "text/event-stream" in operation["responses"]["200"]["content"]
    chat = schema["paths"]["/v1/chat/completions"]["post"]["requestBody"]
    assert {"model", "messages"} <= set(chat["content"]["application/json"]["schema"]["required"])
    assert "$ref" not in json.dumps(chat)  # inlined: nothing points at an unregistered component


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
async def test_a_body_that_is_not_declared_json_is_a_400(
    plain: httpx.AsyncClient, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    reply = await plain.post("/v1/chat/completions", content=json.dumps(CHAT), headers=headers)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["code"] == "unsupported_content_type"
    assert "application/json" in error["message"]
    charset = {"Content-Type": "Application/JSON; charset=utf-8"}
    reply = await plain.post("/v1/chat/completions", content=json.dumps(CHAT), headers=charset)
    assert reply.status_code == 504  # accepted and queued; no worker took it up


@pytest.mark.parametrize("value", [b"NaN", b"Infinity", b"-Infinity"])
async def test_a_temperature_that_is_not_a_number_says_so(
    plain: httpx.AsyncClient, value: bytes
) -> None:
    body = json.dumps(CHAT)[:-1].encode() + b', "temperature": ' + value + b"}"
    reply = await raw_post(plain, "/v1/chat/completions", body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "temperature"
    assert "finite number" in error["message"]


async def test_a_401_says_how_to_authenticate(redis_server: RedisServer, published: None) -> None:
    async with gateway(redis_server, api_keys="k1") as client:
        for reply in (
            await client.get("/v1/models"),
            await client.post("/v1/chat/completions", json=CHAT),
        ):
            assert reply.status_code == 401
            assert reply.headers["www-authenticate"] == "Bearer"


def test_the_openapi_schema_says_which_parameters_need_another(
    redis_server: RedisServer,
) -> None:
    schema = create_app(GatewaySettings(redis_url=redis_server.url)).openapi()
    options = {"stream_options": {"include_usage": True}}
    stream = {"stream": True}
    for path, body in (
        ("/v1/chat/completions", CHAT),
        ("/v1/completions", {"model": "m", "prompt": "a"}),
    ):
        request = schema["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        validator = jsonschema.Draft202012Validator(request["schema"])
        assert validator.is_valid(body)
        assert validator.is_valid(body | options | stream)
        assert validator.is_valid(body | {"stream_options": None})
        assert not validator.is_valid(body | options)
        assert not validator.is_valid(body | options | {"stream": False})
        assert validator.is_valid(body | {"provenance": True, "rejected_drafts": True} | stream)
        assert validator.is_valid(body | {"provenance": False})
        assert not validator.is_valid(body | {"provenance": True})
        assert not validator.is_valid(body | {"rejected_drafts": True} | stream)
        assert validator.is_valid(body | {"speculation": "off"})
        assert not validator.is_valid(body | {"speculation": "eagle"})


async def test_a_model_published_just_after_the_gateway_looked_is_found(
    redis_server: RedisServer, tokenizer_dir: Path
) -> None:
    """The first request after a model's first worker registered is queued, not a 404, even
    when the gateway read the cards a moment before the card was written (scale from zero)."""
    redis_server.client().flushall()
    async with gateway(redis_server, queue_timeout_s=QUEUE_TIMEOUT_S) as client:
        assert (await client.get("/v1/models")).json()["data"] == []  # the cards, read now
        await register(redis_server, tokenizer_dir)
        reply = await client.post("/v1/chat/completions", json=CHAT)
        assert reply.status_code == 504  # queued: no worker took it within the queue timeout
        assert reply.json()["error"]["code"] == "queue_timeout"
        unknown = await client.post("/v1/chat/completions", json=CHAT | {"model": "never-seen"})
        assert unknown.status_code == 404
