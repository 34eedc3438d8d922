"""OpenAI behaviour of the whole stack: real redis-server, worker and gateway processes, and the
official openai client."""

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from dcoco.engine.load import load_engine
from dcoco.shared.engine_config import EngineConfig
from dcoco.shared.sampling import SamplingParams
from dcoco.tokenizer import Tokenizer
from factories import write_models
from stack import Stack, fetch, metric_values, wait_for

pytestmark = pytest.mark.slow
MODEL = Stack.MODEL
HELLO = [{"role": "user", "content": "def add(a, b):"}]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]) -> Iterator[Stack]:
    running = Stack(tmp_path_factory.mktemp("stack"), models).start()
    yield running
    running.stop()


@pytest.fixture
def client(stack: Stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=60)


def greedy(client: openai.OpenAI, content: str, max_tokens: int = 24) -> str:
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0,
    )
    return reply.choices[0].message.content or ""


def test_chat_completion_with_usage(client: openai.OpenAI, models: dict[str, Path]) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=16, temperature=0
    )
    assert reply.object == "chat.completion"
    assert reply.id.startswith("chatcmpl-")
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason in ("length", "stop")
    tokenizer = Tokenizer.from_dir(models["target"])
    usage = reply.usage
    assert usage is not None
    assert usage.prompt_tokens == len(tokenizer.encode(tokenizer.render_chat(HELLO)))
    assert 1 <= usage.completion_tokens <= 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    details = usage.completion_tokens_details
    assert details is not None
    drafted = (details.accepted_prediction_tokens or 0) + (details.rejected_prediction_tokens or 0)
    assert drafted > 0
    block = json.loads((models["dcoco"] / "config.json").read_text())["block_size"]
    assert drafted % block == 0


def test_streaming_matches_the_complete_answer(client: openai.OpenAI) -> None:
    complete = greedy(client, "def add(a, b):")
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
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == complete
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes in (["length"], ["stop"])
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert all(c.usage is None for c in chunks[:-1])


def test_completions_stream_and_not(client: openai.OpenAI) -> None:
    whole = client.completions.create(model=MODEL, prompt="x = [", max_tokens=12, temperature=0)
    assert whole.object == "text_completion"
    streamed = client.completions.create(
        model=MODEL, prompt="x = [", max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == whole.choices[0].text
    batch = client.completions.create(
        model=MODEL, prompt=["x = [", "def f("], max_tokens=8, temperature=0
    )
    assert [c.index for c in batch.choices] == [0, 1]
    assert (
        batch.choices[0].text
        == client.completions.create(model=MODEL, prompt="x = [", max_tokens=8, temperature=0)
        .choices[0]
        .text
    )


def test_n_choices_and_seeds(client: openai.OpenAI) -> None:
    def sample(seed: int, n: int = 3, max_tokens: int = 16) -> list[str]:
        reply = client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=max_tokens, temperature=1.0, seed=seed, n=n
        )
        assert [c.index for c in reply.choices] == list(range(n))
        return [c.message.content or "" for c in reply.choices]

    first = sample(42)
    assert sample(42) == first  # reproducible
    assert len(set(first)) > 1  # the choices are distinct samples
    assert sample(43) != first
    stream = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=8, temperature=1.0, seed=42, n=2, stream=True
    )
    texts = ["", ""]
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
    assert texts == sample(42, n=2, max_tokens=8)


def test_stop_sequences_end_the_text_before_them(client: openai.OpenAI) -> None:
    text = greedy(client, "The cat", max_tokens=40)
    printable = [
        i
        for i in range(5, len(text) - 2)
        if text[i : i + 2].isprintable() and "\ufffd" not in text[i : i + 2]
    ]
    assert printable, text
    cut = printable[len(printable) // 2]
    stop = text[cut : cut + 2]
    expected = text[: text.index(stop)]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "The cat"}],
        max_tokens=40,
        temperature=0,
        stop=[stop],
    )
    assert reply.choices[0].message.content == expected
    assert reply.choices[0].finish_reason == "stop"


def test_max_completion_tokens(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_completion_tokens=3, temperature=0
    )
    assert reply.usage is not None
    assert reply.usage.completion_tokens <= 3


def test_models_route(client: openai.OpenAI) -> None:
    listed = client.models.list()
    assert [m.id for m in listed.data] == [MODEL]


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "nope", "messages": HELLO}, 404, "model"),
        (
            {
                "model": MODEL,
                "messages": HELLO,
                "tools": [{"type": "function", "function": {"name": "f"}}],
            },
            400,
            "tools",
        ),
        ({"model": MODEL, "messages": HELLO, "logprobs": True}, 400, "logprobs"),
        (
            {"model": MODEL, "messages": HELLO, "response_format": {"type": "json_object"}},
            400,
            "response_format",
        ),
        ({"model": MODEL, "messages": HELLO, "temperature": "hot"}, 400, "temperature"),
        ({"model": MODEL, "messages": HELLO, "frobnicate": 1}, 400, "frobnicate"),
        (
            {
                "model": MODEL,
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}
                ],
            },
            400,
            "messages.0.content",
        ),
        ({"model": MODEL, "messages": [{"role": "tool", "content": "x"}]}, 400, "messages.0.role"),
        ({"model": MODEL, "messages": HELLO, "max_tokens": 100_000}, 400, "max_tokens"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "word " * 2000}]},
            400,
            "messages",
        ),
        ({"model": MODEL, "messages": HELLO, "n": 99}, 400, "n"),
        ({"model": MODEL, "messages": HELLO, "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
        (
            {"model": MODEL, "messages": HELLO, "stream_options": {"include_usage": True}},
            400,
            "stream_options",
        ),
        ({"model": MODEL, "messages": []}, 400, "messages"),
    ],
)
def test_bad_requests_get_the_openai_envelope(
    stack: Stack, body: dict[str, object], status: int, param: str
) -> None:
    reply = httpx.post(f"{stack.url}/v1/chat/completions", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["message"]


def test_the_openai_client_raises_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="nope", messages=HELLO)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=HELLO, logprobs=True)
    assert refused.value.param == "logprobs"


@pytest.mark.parametrize(
    ("content", "status"),
    [
        (b"{not json", 400),
        (b"[1, 2]", 400),
        (b"", 400),
        (b"\xff\xfe", 400),
        (json.dumps({"model": MODEL, "messages": HELLO, "x": "y" * 5_000_000}).encode(), 413),
    ],
)
def test_malformed_and_oversized_bodies(stack: Stack, content: bytes, status: int) -> None:
    reply = httpx.post(
        f"{stack.url}/v1/chat/completions",
        content=content,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert reply.status_code == status
    assert reply.json()["error"]["type"] == "invalid_request_error"


def test_unknown_routes_and_methods_get_the_envelope(stack: Stack) -> None:
    assert httpx.get(f"{stack.url}/v1/nothing").json()["error"]["code"] == "not_found"
    wrong = httpx.get(f"{stack.url}/v1/chat/completions")
    assert wrong.status_code == 405
    assert "error" in wrong.json()


def test_32_concurrent_streams_match_single_requests(stack: Stack, client: openai.OpenAI) -> None:
    prompts = [f"item {i}: x = {i} +" for i in range(32)]
    singles = [greedy(client, p, max_tokens=20) for p in prompts[:4]]

    async def stream(async_client: openai.AsyncOpenAI, prompt: str) -> str:
        chunks = await async_client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=20,
            temperature=0,
            stream=True,
        )
        return "".join([c.choices[0].delta.content or "" async for c in chunks if c.choices])

    async def all_at_once() -> list[str]:
        async with openai.AsyncOpenAI(
            base_url=f"{stack.url}/v1", api_key="unused", max_retries=0, timeout=120
        ) as async_client:
            return await asyncio.gather(*(stream(async_client, p) for p in prompts))

    together = asyncio.run(all_at_once())
    assert together[:4] == singles
    assert together[4:] == [greedy(client, p, max_tokens=20) for p in prompts[4:]]


GATEWAY_METRICS = [
    "dcoco_time_to_first_token_seconds",
    "dcoco_inter_token_latency_seconds",
    "dcoco_e2e_request_latency_seconds",
    "dcoco_queue_depth",
    "dcoco_requests_total",
    "dcoco_rejected_requests_total",
    "dcoco_workers",
]
WORKER_METRICS = [
    "dcoco_spec_cycles_total",
    "dcoco_spec_draft_tokens_total",
    "dcoco_spec_accepted_tokens_total",
    "dcoco_spec_accepted_tokens_per_position_total",
    "dcoco_spec_corrected_tokens_total",
    "dcoco_spec_corrected_accepted_tokens_total",
    "dcoco_spec_lookup_draft_tokens_total",
    "dcoco_spec_lookup_accepted_tokens_total",
    "dcoco_spec_acceptance_length",
    "dcoco_spec_cycle_seconds",
    "dcoco_queue_wait_seconds",
    "dcoco_prompt_tokens_total",
    "dcoco_generation_tokens_total",
]


def worker_metrics(stack: Stack) -> dict[str, float]:
    return metric_values(fetch(f"http://127.0.0.1:{stack.metrics_ports[0]}/metrics"))


def counter(values: dict[str, float], name: str) -> float:
    """The model's series of `name`, summed over its other labels (the speculation method)."""
    return sum(
        value
        for key, value in values.items()
        if key.startswith(f"{name}{{") and f'model="{MODEL}"' in key
    )


def test_metrics_agree_with_the_engine(
    stack: Stack, client: openai.OpenAI, models: dict[str, Path]
) -> None:
    """The acceptance the counters report equals what the torch engine computes in-process."""
    prompts = [f"def f{i}(x):" for i in range(6)]
    before = worker_metrics(stack)
    replies = [
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": p}], max_tokens=30, temperature=0
        )
        for p in prompts
    ]
    after = worker_metrics(stack)
    cycles = counter(after, "dcoco_spec_cycles_total") - counter(before, "dcoco_spec_cycles_total")
    accepted = counter(after, "dcoco_spec_accepted_tokens_total") - counter(
        before, "dcoco_spec_accepted_tokens_total"
    )
    usage_accepted = sum(
        r.usage.completion_tokens_details.accepted_prediction_tokens for r in replies
    )  # type: ignore[union-attr, misc]
    assert accepted == usage_accepted

    tokenizer = Tokenizer.from_dir(models["target"])
    engine = load_engine(
        models["target"],
        models["dcoco"],
        EngineConfig(max_model_len=512, eos_token_ids=tokenizer.eos_token_ids),
    )
    ids = [
        tokenizer.encode(tokenizer.render_chat([{"role": "user", "content": p}])) for p in prompts
    ]
    completions, engine_cycles = engine.generate(ids, SamplingParams(max_tokens=30))
    # The stream holds back a trailing cut character (U+FFFD) for good; otherwise the same text.
    served = [(r.choices[0].message.content or "").rstrip("\ufffd") for r in replies]
    assert [tokenizer.decode(c.token_ids).rstrip("\ufffd") for c in completions] == served
    engine_accepted = sum(c.accepted_tokens for c in engine_cycles)
    engine_verifications = sum(c.verifications for c in engine_cycles)
    assert 1 + accepted / cycles == pytest.approx(1 + engine_accepted / engine_verifications)


def test_every_contract_metric_is_exported(stack: Stack, client: openai.OpenAI) -> None:
    list(
        client.chat.completions.create(
            model=MODEL, messages=HELLO, max_tokens=12, temperature=0, stream=True
        )
    )
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HELLO)
    gateway_text = fetch(f"{stack.url}/metrics")
    worker_text = fetch(f"http://127.0.0.1:{stack.metrics_ports[0]}/metrics")
    for name in GATEWAY_METRICS:
        assert f"\n{name}" in gateway_text, name
    for name in WORKER_METRICS:
        assert f"\n{name}" in worker_text, name
    gateway = metric_values(gateway_text)
    assert gateway[f'dcoco_workers{{model="{MODEL}"}}'] == 1
    assert gateway['dcoco_rejected_requests_total{reason="model_not_found"}'] >= 1
    assert gateway[f'dcoco_time_to_first_token_seconds_count{{model="{MODEL}"}}'] >= 1
    worker = metric_values(worker_text)
    length_sum = counter(worker, "dcoco_spec_acceptance_length_sum")
    length_count = counter(worker, "dcoco_spec_acceptance_length_count")
    mean_from_counters = 1 + counter(worker, "dcoco_spec_accepted_tokens_total") / counter(
        worker, "dcoco_spec_cycles_total"
    )
    assert length_sum / length_count == pytest.approx(mean_from_counters)
    assert worker[f'dcoco_queue_wait_seconds_count{{model="{MODEL}"}}'] >= 1


def test_a_malformed_queue_entry_is_dropped_and_counted(
    stack: Stack, client: openai.OpenAI
) -> None:
    redis = stack.redis.client()
    stream = f"dcoco:{MODEL}:requests"
    redis.xadd(stream, {"r": '{"id": "x", "prompt_ids": "not a list"}'})
    redis.xadd(stream, {"junk": "no envelope at all"})

    def dropped() -> bool:
        values = worker_metrics(stack)
        return (
            values.get(f'dcoco_worker_requests_total{{model="{MODEL}",outcome="malformed"}}') == 2
        )

    wait_for(dropped, timeout=10, what="both entries dropped")
    wait_for(lambda: redis.xlen(stream) == 0, timeout=10, what="the entries deleted")
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0)
    assert reply.choices[0].finish_reason == "length"  # the worker carries on
