"""One streamed chat request, timed from the client's side.

What is recorded, per request (the definitions that use it are in `dcoco.bench.metrics`):
- the arrival time of every content chunk (a chunk whose delta carries non-empty text), in
  seconds since the request was sent;
- the end of the stream (`data: [DONE]` or the connection closing);
- the `usage` object of the final chunk, the only source of token counts;
- when the server streams cumulative usage on every chunk (vLLM's
  `stream_options.continuous_usage_stats`), the arrival time and size of every increase in
  `completion_tokens`, which gives exact per-token gaps.
"""

import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

Message = dict[str, str]


@dataclass(frozen=True)
class Server:
    name: str
    url: str  # base URL, without /v1
    model: str
    metrics_url: str | None  # Prometheus text with spec-decode counters, if any
    # The speculation every request asks for (DCOCO's `speculation`): variants of one server
    # compared side by side; None sends no such field.
    speculation: str | None = None


@dataclass(frozen=True)
class Call:
    """What one request asks for; the same call goes to every server compared."""

    suite: str
    messages: list[Message]
    max_tokens: int
    temperature: float
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # e.g. chat_template_kwargs


@dataclass
class Outcome:
    ok: bool = False
    error: str | None = None
    chunk_times: list[float] = field(default_factory=list)  # content chunks
    token_steps: list[tuple[float, int]] = field(default_factory=list)  # (time, new tokens)
    end: float = 0.0  # seconds from sending to the end of the stream
    prompt_tokens: int = 0
    completion_tokens: int = 0
    accepted: int | None = None  # usage.completion_tokens_details.accepted_prediction_tokens
    rejected: int | None = None


def body(server: Server, call: Call, continuous_usage: bool) -> dict[str, Any]:
    options: dict[str, bool] = {"include_usage": True}
    if continuous_usage:
        options["continuous_usage_stats"] = True
    payload: dict[str, Any] = {
        "model": server.model,
        "messages": call.messages,
        "max_tokens": call.max_tokens,
        "temperature": call.temperature,
        "stream": True,
        "stream_options": options,
    }
    if call.seed is not None:
        payload["seed"] = call.seed
    if server.speculation is not None:
        payload["speculation"] = server.speculation
    return payload | call.extra


async def stream_chat(
    http: aiohttp.ClientSession,
    server: Server,
    call: Call,
    timeout_s: float,
    continuous_usage: bool = False,
) -> Outcome:
    """Sends `call` and reads its stream to the end, within `timeout_s` in all. Failures are
    recorded in the outcome, never raised: a benchmark counts them."""
    outcome = Outcome()
    started = time.perf_counter()
    try:
        async with http.post(
            f"{server.url}/v1/chat/completions",
            json=body(server, call, continuous_usage),
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as reply:
            if reply.status != 200:
                outcome.error = f"HTTP {reply.status}: {error_message(await reply.text())}"
                return outcome
            await _read_stream(reply, outcome, started)
    except TimeoutError:
        outcome.error = f"no complete answer within {timeout_s:g} s"
    except aiohttp.ClientError as problem:
        outcome.error = f"{type(problem).__name__}: {problem}"
    outcome.end = time.perf_counter() - started
    if outcome.error is None and not outcome.chunk_times:
        outcome.error = "the stream carried no content"
    outcome.ok = outcome.error is None
    return outcome


async def _read_stream(reply: aiohttp.ClientResponse, outcome: Outcome, started: float) -> None:
    usage: dict[str, Any] | None = None
    seen_tokens = 0
    async for raw in reply.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue  # blank separators and SSE comments (keep-alive pings)
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        now = time.perf_counter() - started
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError:
            chunk = None
        if not isinstance(chunk, dict):
            outcome.error = f"a stream chunk is not a JSON object: {data[:80]!r}"
            return
        if "error" in chunk:
            outcome.error = f"error event: {error_message(data.decode())}"
            return
        for choice in chunk.get("choices") or []:
            if (choice.get("delta") or {}).get("content"):
                outcome.chunk_times.append(now)
                break
        if chunk.get("usage"):
            usage = chunk["usage"]
            total = int(usage.get("completion_tokens") or 0)
            if chunk.get("choices") and total > seen_tokens:
                outcome.token_steps.append((now, total - seen_tokens))
            seen_tokens = max(seen_tokens, total)
    if usage is None:
        outcome.error = "the stream carried no usage (is stream_options.include_usage supported?)"
        return
    outcome.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    outcome.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("completion_tokens_details") or {}
    if details.get("accepted_prediction_tokens") is not None:
        outcome.accepted = int(details["accepted_prediction_tokens"])
        outcome.rejected = int(details.get("rejected_prediction_tokens") or 0)


def error_message(text: str) -> str:
    """The message of an OpenAI error envelope, else the start of the text, on one line."""
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError:
        parsed = None
    if isinstance(parsed, dict) and isinstance(parsed.get("error"), dict):
        return str(parsed["error"].get("message", parsed["error"]))
    return " ".join(text.split())[:200]
