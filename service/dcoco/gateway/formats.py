"""OpenAI response objects and stream chunks, for chat and for completions."""

import json
from dataclasses import dataclass
from typing import Any

from dcoco.queue.protocol import Usage


@dataclass
class Choice:
    index: int
    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None


@dataclass(frozen=True)
class Format:
    """How one route spells its objects: chat.completion(.chunk) or text_completion."""

    chat: bool
    id: str
    created: int
    model: str
    include_usage_chunk: bool = False

    def _base(self, chunk: bool) -> dict[str, Any]:
        kind = (
            ("chat.completion.chunk" if chunk else "chat.completion")
            if self.chat
            else "text_completion"
        )
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def response(self, choices: list[Choice], prompt_tokens: int) -> dict[str, Any]:
        body = self._base(chunk=False)
        body["choices"] = [self._final_choice(c) for c in choices]
        body["usage"] = usage(choices, prompt_tokens)
        return body

    def _final_choice(self, c: Choice) -> dict[str, Any]:
        if self.chat:
            message = {"role": "assistant", "content": c.text, "refusal": None}
            return {
                "index": c.index,
                "message": message,
                "logprobs": None,
                "finish_reason": c.finish_reason,
            }
        return {
            "index": c.index,
            "text": c.text,
            "logprobs": None,
            "finish_reason": c.finish_reason,
        }

    def chunk(
        self, index: int, text: str | None, finish_reason: str | None = None, role: bool = False
    ) -> bytes:
        """One SSE chunk for one choice: the role opener, a content delta, or the finish."""
        body = self._base(chunk=True)
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            choice = {
                "index": index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        else:
            choice = {
                "index": index,
                "text": text or "",
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        body["choices"] = [choice]
        if self.include_usage_chunk:
            body["usage"] = None
        return sse(body)

    def usage_chunk(self, choices: list[Choice], prompt_tokens: int) -> bytes:
        body = self._base(chunk=True)
        body["choices"] = []
        body["usage"] = usage(choices, prompt_tokens)
        return sse(body)


def usage(choices: list[Choice], prompt_tokens: int) -> dict[str, Any]:
    completion = sum(c.usage.completion_tokens for c in choices if c.usage)
    accepted = sum(c.usage.accepted_prediction_tokens for c in choices if c.usage)
    rejected = sum(c.usage.rejected_prediction_tokens for c in choices if c.usage)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": rejected,
        },
    }


def sse(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"  # an SSE comment: clients ignore it, proxies see a live connection
