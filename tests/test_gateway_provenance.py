"""Per-request speculation and the stream's provenance extension, at the gateway: in-process
(httpx.ASGITransport) against a real redis-server, with a scripted worker that writes the events
a torch worker would (tokens with their provenance, cycles, rejected drafts). What each engine
fills is tested with real engines in test_playground.py and test_serving.py."""

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from dcoco.gateway.app import create_app
from dcoco.gateway.playground import page
from dcoco.queue.connection import connect
from dcoco.queue.consumer import WorkerQueue
from dcoco.queue.protocol import Envelope, Event, ModelCard, Usage
from dcoco.settings import GatewaySettings
from dcoco.tokenizer import Tokenizer, save_tokenizer, train_tokenizer
from stack import RedisServer

TEXTS = ["hello world, the cat sat on the mat. ünïcödé 😀"] * 20
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
STREAM = CHAT | {"stream": True, "stream_options": {"include_usage": True}}
TORCH = {"engine": "torch", "speculation": ("off", "dflash", "dcoco"), "provenance": True}
VLLM = {"engine": "vllm", "speculation": ("dcoco",), "provenance": False}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tok")
    save_tokenizer(train_tokenizer(TEXTS, vocab_size=300), folder)
    return folder


@pytest.fixture
def tokenizer(tokenizer_dir: Path) -> Tokenizer:
    return Tokenizer.from_dir(tokenizer_dir)


async def publish(server: RedisServer, tokenizer_dir: Path, **capabilities: Any) -> None:
    tokenizer = Tokenizer.from_dir(tokenizer_dir)
    card = ModelCard(
        name="m",
        max_model_len=64,
        tokenizer_sha="tok",
        chat_template=tokenizer.chat_template,
        created=0,
        default_speculation=capabilities.get("speculation", ("dcoco",))[-1],
        **capabilities,
    )
    client = connect(server.url)
    await WorkerQueue(client, client, "m", "nobody", 10).register(
        card, (tokenizer_dir / "tokenizer.json").read_text()
    )
    await client.aclose()


@pytest.fixture
async def gateway(
    redis_server: RedisServer, tokenizer_dir: Path
) -> AsyncIterator[Callable[..., Any]]:
    """`gateway(**capabilities)`: a client of a gateway whose model "m" has that card."""
    redis_server.client().flushall()
    clients: list[httpx.AsyncClient] = []

    async def make(**capabilities: Any) -> httpx.AsyncClient:
        await publish(redis_server, tokenizer_dir, **capabilities)
        app = create_app(GatewaySettings(redis_url=redis_server.url, queue_timeout_s=5))
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://gateway", timeout=30
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()


def cycles(tokenizer: Tokenizer) -> list[Event]:
    """Three deltas as a DCOCO worker writes them: the prefill's token, then two cycles."""
    ids = tokenizer.encode("hello world, the cat ünï")
    rejected = tuple(tokenizer.encode(" mat. 😀"))
    return [
        Event(kind="delta", seq=0, attempt=1, token_ids=(ids[0],), provenance=("target",), cycle=0),
        Event(
            kind="delta",
            seq=1,
            attempt=1,
            token_ids=tuple(ids[1:4]),
            provenance=("drafted", "corrected", "target"),
            cycle=1,
            rejected_ids=rejected,
            accepted=2,
            rejected=len(rejected),
        ),
        Event(
            kind="delta",
            seq=2,
            attempt=1,
            token_ids=tuple(ids[4:]),
            provenance=("drafted",) * (len(ids) - 5) + ("target",),
            cycle=2,
        ),
    ]


async def answer(server: RedisServer, tokenizer: Tokenizer, events: list[Event]) -> Envelope:
    """Plays one worker: takes the next request of "m", writes `events` (texts filled in as
    the worker's detokenizer would) and a done; returns the request's envelope."""
    client = connect(server.url)
    try:
        queue = WorkerQueue(client, client, "m", "scripted", 10)
        deliveries = []
        while not deliveries:
            deliveries = await queue.read(1, 200)
        [delivery] = deliveries
        assert delivery.envelope is not None
        owned = await queue.own(delivery.envelope.id, reclaimed=False)
        assert owned is not None
        generated: list[int] = []
        writes = []
        for event in events:
            before = tokenizer.decode(generated)
            generated += event.token_ids
            text = tokenizer.decode(generated)[len(before) :]
            writes.append((owned, event.model_copy(update={"text": text}), ""))
        accepted = sum(
            e.provenance.count("drafted") + e.provenance.count("corrected") for e in events
        )
        usage = Usage(
            prompt_tokens=len(delivery.envelope.prompt_ids),
            completion_tokens=len(generated),
            accepted_prediction_tokens=accepted,
            rejected_prediction_tokens=sum(len(e.rejected_ids) for e in events),
        )
        done = Event(kind="done", seq=len(events), attempt=1, finish_reason="length", usage=usage)
        await queue.append([*writes, (owned, done, delivery.entry_id)])
        return delivery.envelope
    finally:
        await client.aclose()


async def stream(client: httpx.AsyncClient, body: dict[str, Any]) -> list[dict[str, Any]]:
    async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        assert reply.status_code == 200, await reply.aread()
        lines = [line async for line in reply.aiter_lines() if line.startswith("data: {")]
    return [json.loads(line.removeprefix("data: ")) for line in lines]


async def ask(
    gateway: Callable[..., Any],
    server: RedisServer,
    tokenizer: Tokenizer,
    body: dict[str, Any],
    events: list[Event],
) -> tuple[list[dict[str, Any]], Envelope]:
    client = await gateway(**TORCH)
    worker = asyncio.create_task(answer(server, tokenizer, events))
    chunks = await stream(client, body)
    return chunks, await worker


async def test_provenance_is_absent_unless_asked(
    gateway: Callable[..., Any], redis_server: RedisServer, tokenizer: Tokenizer
) -> None:
    chunks, envelope = await ask(gateway, redis_server, tokenizer, STREAM, cycles(tokenizer))
    assert envelope.provenance is False
    assert envelope.speculation is None
    assert all("provenance" not in choice for c in chunks for choice in c["choices"])
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == "hello world, the cat ünï"


async def test_chunks_carry_each_tokens_text_source_and_cycle(
    gateway: Callable[..., Any], redis_server: RedisServer, tokenizer: Tokenizer
) -> None:
    events = cycles(tokenizer)
    body = STREAM | {"provenance": True, "speculation": "dflash"}
    chunks, envelope = await ask(gateway, redis_server, tokenizer, body, events)
    assert envelope.provenance is True
    assert envelope.speculation == "dflash"
    parts = [ch["provenance"] for c in chunks for ch in c["choices"] if "provenance" in ch]
    assert [p["cycle"] for p in parts] == [0, 1, 2]
    tokens = [t for p in parts for t in p["tokens"]]
    assert [t["id"] for t in tokens] == [i for e in events for i in e.token_ids]
    assert [t["source"] for t in tokens] == [s for e in events for s in e.provenance]
    assert "".join(t["text"] for t in tokens) == "hello world, the cat ünï"
    assert all("rejected" not in p for p in parts)  # not asked
    usage = chunks[-1]["usage"]["completion_tokens_details"]
    sources = [t["source"] for t in tokens]
    assert (
        sources.count("drafted") + sources.count("corrected") == usage["accepted_prediction_tokens"]
    )


async def test_rejected_drafts_come_decoded_when_asked(
    gateway: Callable[..., Any], redis_server: RedisServer, tokenizer: Tokenizer
) -> None:
    body = STREAM | {"provenance": True, "rejected_drafts": True}
    chunks, _ = await ask(gateway, redis_server, tokenizer, body, cycles(tokenizer))
    parts = [ch["provenance"] for c in chunks for ch in c["choices"] if "provenance" in ch]
    assert next(len(p["rejected"]) for p in parts) == 0
    assert "".join(r["text"] for r in parts[1]["rejected"]) == " mat. 😀"
    rejected = sum(len(p["rejected"]) for p in parts)
    assert (
        rejected == chunks[-1]["usage"]["completion_tokens_details"]["rejected_prediction_tokens"]
    )


async def test_events_without_provenance_give_null_sources(
    gateway: Callable[..., Any], redis_server: RedisServer, tokenizer: Tokenizer
) -> None:
    """A worker that says nothing of provenance (an older one): the tokens still come, with
    source and cycle null, as documented."""
    bare = [e.model_copy(update={"provenance": (), "cycle": None}) for e in cycles(tokenizer)]
    chunks, _ = await ask(gateway, redis_server, tokenizer, STREAM | {"provenance": True}, bare)
    parts = [ch["provenance"] for c in chunks for ch in c["choices"] if "provenance" in ch]
    assert {p["cycle"] for p in parts} == {None}
    assert {t["source"] for p in parts for t in p["tokens"]} == {None}


BAD = {
    "unknown speculation": ({"speculation": "eagle"}, "speculation"),
    "speculation of the wrong type": ({"speculation": 1}, "speculation"),
    "provenance without a stream": ({"provenance": True}, "provenance"),
    "provenance as a string": ({"provenance": "yes", "stream": True}, "provenance"),
    "rejected drafts without provenance": (
        {"rejected_drafts": True, "stream": True},
        "rejected_drafts",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_bad_values_are_400_naming_the_parameter(
    gateway: Callable[..., Any], case: str
) -> None:
    extra, param = BAD[case]
    client = await gateway(**TORCH)
    reply = await client.post("/v1/chat/completions", json=CHAT | extra)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert param in error["message"]


async def test_what_a_vllm_model_cannot_give_is_a_400_naming_it(
    gateway: Callable[..., Any],
) -> None:
    client = await gateway(**VLLM)
    for extra, param in (
        ({"speculation": "off"}, "speculation"),
        ({"stream": True, "provenance": True}, "provenance"),
    ):
        reply = await client.post("/v1/chat/completions", json=CHAT | extra)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert (error["param"], error["code"]) == (param, "unsupported_value")
        assert "vllm" in error["message"]
    [model] = (await client.get("/v1/models")).json()["data"]
    assert (model["engine"], model["speculation"], model["provenance"]) == (
        "vllm",
        ["dcoco"],
        False,
    )


async def test_the_official_client_reads_the_extension(
    gateway: Callable[..., Any], redis_server: RedisServer, tokenizer: Tokenizer
) -> None:
    client = await gateway(**TORCH)
    worker = asyncio.create_task(answer(redis_server, tokenizer, cycles(tokenizer)))
    sdk = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="-", http_client=client)
    chunks = await sdk.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": "hello"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"speculation": "dcoco", "provenance": True, "rejected_drafts": True},
    )
    sources = []
    async for chunk in chunks:
        for choice in chunk.choices:
            extension = (choice.model_extra or {}).get("provenance")
            if extension:
                sources += [t["source"] for t in extension["tokens"]]
        if chunk.usage:
            usage = chunk.usage
    envelope = await worker
    assert envelope.speculation == "dcoco"
    assert usage.completion_tokens == len(sources)
    assert usage.completion_tokens_details is not None
    assert usage.completion_tokens_details.accepted_prediction_tokens == sum(
        s in ("drafted", "corrected") for s in sources
    )


async def test_the_playground_is_one_page_that_runs_only_its_own_script(
    gateway: Callable[..., Any],
) -> None:
    client = await gateway(**TORCH)
    reply = await client.get("/playground")
    assert reply.status_code == 200
    assert reply.headers["content-type"].startswith("text/html")
    policy = reply.headers["content-security-policy"]
    assert "default-src 'none'" in policy
    assert "connect-src 'self'" in policy
    assert "unsafe-inline" not in policy
    html = reply.text
    assert html == page()[0]
    assert html.count("<script>") == 1
    assert "<script src" not in html
    assert "http://" not in html
    assert "https://" not in html
    assert "innerHTML" not in html
    assert "insertAdjacentHTML" not in html
    assert "/playground" not in json.dumps(create_app(GatewaySettings()).openapi()["paths"])
