"""What the gateway answers, as pydantic models: completions, stream chunks and their events,
the model list, probes and OpenAI's error envelope. The routes build these objects and the
OpenAPI document is generated from them (`gateway/docs.py`); nothing is described twice.

The stream extension (`provenance` on a chunk's choice) appears only when the request asked for
it (`provenance: true`); its `rejected` list only with `rejected_drafts: true`.
"""

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, GetJsonSchemaHandler, NonNegativeInt
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from dcoco.queue.protocol import Speculation

Finish = Literal["stop", "length"] | None
Source = Literal["drafted", "corrected", "target"]


def _absent_if_none(value: object) -> bool:
    return value is None


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ErrorDetail(Closed):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorEnvelope(Closed):
    """OpenAI's error envelope: every error status, and an error event inside a stream."""

    error: ErrorDetail


class PredictionDetails(BaseModel):
    accepted_prediction_tokens: NonNegativeInt = Field(
        description="Drafted tokens the target accepted and the completion kept."
    )
    rejected_prediction_tokens: NonNegativeInt = Field(
        description="Drafted tokens the target rejected, or that a stop or max_tokens cut off."
    )


class Usage(BaseModel):
    prompt_tokens: NonNegativeInt
    completion_tokens: NonNegativeInt
    total_tokens: NonNegativeInt
    completion_tokens_details: PredictionDetails


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str
    refusal: None = None


class ChatChoice(BaseModel):
    index: NonNegativeInt
    message: AssistantMessage
    logprobs: None = None
    finish_reason: Finish


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class TextChoice(BaseModel):
    index: NonNegativeInt
    text: str
    logprobs: None = None
    finish_reason: Finish


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


class TokenPiece(BaseModel):
    id: NonNegativeInt = Field(description="The token id.")
    text: str = Field(
        description="The token's text, decoded incrementally by the model's tokenizer: empty "
        "for a special token, or for a token that ends inside a character (the next piece then "
        "carries the whole character)."
    )
    source: Source | None = Field(
        description="drafted: the drafter's own top-1, accepted by the target; corrected: "
        "re-selected by the DCOCO corrector, accepted; target: the target's own token (the "
        "bonus token of a cycle, or plain decoding); null where the engine did not say."
    )


class RejectedPiece(BaseModel):
    id: NonNegativeInt
    text: str = Field(description="Decoded on its own, from the start of the rejected draft.")


class ChunkProvenance(BaseModel):
    """Where the tokens of one chunk came from (asked for with `provenance: true`)."""

    cycle: NonNegativeInt | None = Field(
        description="The request's verification cycle these tokens came from (0: the token "
        "that ends the prompt's prefill); null where the engine did not say."
    )
    tokens: list[TokenPiece] = Field(
        description="Every token of the chunk, in order. Their texts join into the generated "
        "text, which `content` carries as well (held back there while it may start a stop "
        "string, and cut before one)."
    )
    rejected: list[RejectedPiece] | None = Field(
        default=None,
        exclude_if=_absent_if_none,
        description="The cycle's draft past what the target accepted (only with "
        "`rejected_drafts: true`).",
    )


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = Field(default=None, exclude_if=_absent_if_none)
    content: str | None = Field(default=None, exclude_if=_absent_if_none)


class ChatChunkChoice(BaseModel):
    index: NonNegativeInt
    delta: ChatDelta
    logprobs: None = None
    finish_reason: Finish
    provenance: ChunkProvenance | None = Field(default=None, exclude_if=_absent_if_none)


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = Field(
        default=None,
        description="Absent unless stream_options.include_usage: then null, except in the last "
        "chunk, whose choices are empty.",
    )


class TextChunkChoice(BaseModel):
    index: NonNegativeInt
    text: str
    logprobs: None = None
    finish_reason: Finish
    provenance: ChunkProvenance | None = Field(default=None, exclude_if=_absent_if_none)


class TextCompletionChunk(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[TextChunkChoice]
    usage: Usage | None = Field(
        default=None,
        description="Absent unless stream_options.include_usage: then null, except in the last "
        "chunk, whose choices are empty.",
    )


class JsonOrDone:
    """The JSON schema of an SSE event's `data`: `[DONE]`, or JSON of one of `models`."""

    def __init__(self, *models: type[BaseModel]) -> None:
        self.models = models

    def __get_pydantic_json_schema__(
        self, _: core_schema.CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        payload = handler(
            core_schema.union_schema([m.__pydantic_core_schema__ for m in self.models])
        )
        json_payload = {
            "type": "string",
            "contentMediaType": "application/json",
            "contentSchema": payload,
        }
        return {"anyOf": [{"const": "[DONE]"}, json_payload]}


class ChatCompletionEvent(BaseModel):
    """One server-sent event of a chat stream: a chunk, an error, or the final [DONE]."""

    data: Annotated[str, JsonOrDone(ChatCompletionChunk, ErrorEnvelope)]


class TextCompletionEvent(BaseModel):
    """One server-sent event of a completions stream: a chunk, an error, or the final [DONE]."""

    data: Annotated[str, JsonOrDone(TextCompletionChunk, ErrorEnvelope)]


class ModelEntry(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "dcoco"
    max_model_len: NonNegativeInt
    engine: str | None = Field(description="The workers' engine: torch, vllm (null: not said).")
    speculation: list[Speculation] = Field(
        description="The values a request's `speculation` may take (empty: not said)."
    )
    default_speculation: Speculation | None = Field(
        description="What a request without `speculation` gets."
    )
    provenance: bool | None = Field(
        description="Whether streams can carry token provenance (`provenance: true`); false "
        "on vLLM, which reports acceptance per request only."
    )


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelEntry]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


class Readiness(BaseModel):
    status: Literal["ready"] = "ready"
    workers: dict[str, int] = Field(description="Live workers per model.")


def dump(reply: BaseModel, **options: Any) -> bytes:
    """The reply's JSON, compact, as every response and chunk is sent."""
    return reply.model_dump_json(**options).encode()
