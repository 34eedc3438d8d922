"""How a generation route answers, built from the models in `replies.py`: one completion object,
or a stream of server-sent chunks (chat.completion.chunk or text_completion), ending with the
usage chunk when asked and `[DONE]`."""

import logging
from dataclasses import dataclass

from pydantic import BaseModel

from dcoco.gateway.replies import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatDelta,
    ChunkProvenance,
    Finish,
    PredictionDetails,
    TextChoice,
    TextChunkChoice,
    TextCompletion,
    TextCompletionChunk,
    Usage,
    dump,
)
from dcoco.queue import protocol

log = logging.getLogger(__name__)
DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"  # an SSE comment: clients ignore it, proxies see a live connection


@dataclass
class Choice:
    """One choice as its events arrive: text so far, and how it ended."""

    index: int
    text: str = ""
    finish_reason: str | None = None
    usage: protocol.Usage | None = None


@dataclass(frozen=True)
class Answer:
    """How one request is answered: chat or text completion, its id, time and model."""

    chat: bool
    id: str
    created: int
    model: str
    include_usage_chunk: bool = False

    def response(self, choices: list[Choice], prompt_tokens: int) -> BaseModel:
        total = usage(choices, prompt_tokens)
        if self.chat:
            return ChatCompletion(
                id=self.id,
                created=self.created,
                model=self.model,
                choices=[
                    ChatChoice(
                        index=c.index,
                        message=AssistantMessage(content=c.text),
                        finish_reason=finish(c.finish_reason),
                    )
                    for c in choices
                ],
                usage=total,
            )
        return TextCompletion(
            id=self.id,
            created=self.created,
            model=self.model,
            choices=[
                TextChoice(index=c.index, text=c.text, finish_reason=finish(c.finish_reason))
                for c in choices
            ],
            usage=total,
        )

    def chunk(
        self,
        index: int,
        text: str | None,
        finish_reason: str | None = None,
        role: bool = False,
        provenance: ChunkProvenance | None = None,
    ) -> bytes:
        """One SSE chunk for one choice: the role opener, a content delta, or the finish."""
        reason = finish(finish_reason)
        chunk: BaseModel
        if self.chat:
            opener = "" if role and text is None else text
            delta = ChatDelta(role="assistant" if role else None, content=opener)
            choice = ChatChunkChoice(
                index=index, delta=delta, finish_reason=reason, provenance=provenance
            )
            chunk = ChatCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[choice]
            )
        else:
            text_choice = TextChunkChoice(
                index=index, text=text or "", finish_reason=reason, provenance=provenance
            )
            chunk = TextCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[text_choice]
            )
        return sse(chunk, exclude=None if self.include_usage_chunk else {"usage"})

    def usage_chunk(self, choices: list[Choice], prompt_tokens: int) -> bytes:
        total = usage(choices, prompt_tokens)
        if self.chat:
            return sse(
                ChatCompletionChunk(
                    id=self.id, created=self.created, model=self.model, choices=[], usage=total
                )
            )
        return sse(
            TextCompletionChunk(
                id=self.id, created=self.created, model=self.model, choices=[], usage=total
            )
        )


def usage(choices: list[Choice], prompt_tokens: int) -> Usage:
    completion = sum(c.usage.completion_tokens for c in choices if c.usage)
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion,
        total_tokens=prompt_tokens + completion,
        completion_tokens_details=PredictionDetails(
            accepted_prediction_tokens=sum(
                c.usage.accepted_prediction_tokens for c in choices if c.usage
            ),
            rejected_prediction_tokens=sum(
                c.usage.rejected_prediction_tokens for c in choices if c.usage
            ),
        ),
    )


def finish(reason: str | None) -> Finish:
    """A worker's finish reason as OpenAI spells it: stop or length."""
    if reason is None or reason in ("stop", "length"):
        return reason  # type: ignore[return-value]
    log.warning("unexpected finish reason %r from a worker, answered as stop", reason)
    return "stop"


def sse(reply: BaseModel, exclude: set[str] | None = None) -> bytes:
    return b"data: " + dump(reply, exclude=exclude) + b"\n\n"
