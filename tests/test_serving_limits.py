"""Requests at the edges, against real processes: many choices on a worker that runs one at a
time, and a large body while another stream is running."""

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from dcoco.tokenizer import Tokenizer
from factories import write_models
from stack import Stack, wait_for

pytestmark = pytest.mark.slow
MODEL = Stack.MODEL


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_models(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def one_at_a_time(
    tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]
) -> Iterator[Stack]:
    """The instant engine with room for one request: choices finish before others start."""
    stack = Stack(tmp_path_factory.mktemp("one"), models, DCOCO_ENGINE="instant")
    stack.start(DCOCO_MAX_BATCH_SIZE="1")
    yield stack
    stack.stop()


def test_many_choices_on_a_one_slot_worker_all_complete(one_at_a_time: Stack) -> None:
    client = openai.OpenAI(
        base_url=f"{one_at_a_time.url}/v1", api_key="-", max_retries=0, timeout=30
    )
    prompts = [f"prompt {i}" for i in range(64)]
    reply = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0)
    assert sorted(c.index for c in reply.choices) == list(range(64))
    assert all(c.finish_reason == "length" and c.text for c in reply.choices)
    stream = client.completions.create(
        model=MODEL, prompt="p", n=2, max_tokens=4, temperature=0, stream=True
    )
    finished = [c.choices[0].index for c in stream if c.choices and c.choices[0].finish_reason]
    assert sorted(finished) == [0, 1]  # and the iteration ended: [DONE] arrived


def test_a_large_body_does_not_stall_a_concurrent_stream(
    tmp_path: Path, models: dict[str, Path]
) -> None:
    stack = Stack(tmp_path, models, DCOCO_MODE="vanilla", DCOCO_MAX_MODEL_LEN="4096").start()
    try:
        gaps: list[float] = []

        def stream_long_answer() -> None:
            body = {
                "model": MODEL,
                "messages": [{"role": "user", "content": "def main():"}],
                "max_tokens": 400,
                "temperature": 0,
                "stream": True,
            }
            with httpx.stream(
                "POST", f"{stack.url}/v1/chat/completions", json=body, timeout=60
            ) as r:
                last = None
                for line in r.iter_lines():
                    now = time.monotonic()
                    if line.startswith("data: {") and last is not None:
                        gaps.append(now - last)
                    last = now

        content = "x = 1\n" * 550_000
        # What tokenizing the body would cost on this machine now (a tenth of it, timed):
        # the bounds below are fractions of it, not absolute times.
        tokenizer = Tokenizer.from_dir(models["target"])
        started = time.monotonic()
        tokenizer.encode(content[: len(content) // 10])
        tokenize_s = 10 * (time.monotonic() - started)
        streaming = threading.Thread(target=stream_long_answer)
        streaming.start()
        wait_for(lambda: len(gaps) >= 10, timeout=60, what="the stream to flow")
        big = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}]})
        assert len(big) < 4 * 1024 * 1024
        started = time.monotonic()
        refused = httpx.post(
            f"{stack.url}/v1/chat/completions",
            content=big,
            headers={"Content-Type": "application/json"},
            timeout=60,
        )
        took = time.monotonic() - started
        streaming.join(timeout=60)
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "context_length_exceeded"
        # Refused by its token bound, without tokenizing it (bodies the bound lets through are
        # tested in test_gateway_clients), and the stream never waited for anything as long.
        assert "at least" in refused.json()["error"]["message"]
        assert took < tokenize_s / 3, (took, tokenize_s)
        assert len(gaps) > 50
        assert max(gaps) < tokenize_s / 3, (
            f"the stream went silent for {max(gaps):.2f} s (tokenizing: {tokenize_s:.2f} s)"
        )
    finally:
        stack.stop()
