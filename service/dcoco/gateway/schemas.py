"""OpenAI request bodies, validated strictly: anything this server cannot honour is a 400 that
names the parameter, never silently ignored.

Types are strict, as in OpenAI's API: "4" is not an integer and 0 is not a boolean. These models
are also the OpenAPI schema of the routes, so clients and fuzzers see what the routes accept.

Three parameters are this server's own (the openai client sends them with `extra_body`):
`speculation` picks the request's speculative decoding, `provenance` adds to each stream chunk
where its tokens came from, and `rejected_drafts` adds the drafts the target rejected.
"""

from typing import Annotated, Any, Literal, TypeVar

import pydantic_core
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from dcoco.gateway.errors import InvalidRequest, Unsupported
from dcoco.queue.protocol import Speculation

MAX_STOPS = 4  # OpenAI's limit
MAX_STOP_CHARS = 256

# OpenAI parameters this server does not implement, with the values that mean "off". A request
# may send them with one of these values (many SDKs do); anything else is refused.
NEUTRAL: dict[str, tuple[Any, ...]] = {
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "logprobs": (False, 0),
    "top_logprobs": (0,),
    "logit_bias": ({},),
    "tools": ([],),
    "tool_choice": ("none",),
    "functions": ([],),
    "function_call": ("none",),
    "parallel_tool_calls": (False, True),
    "response_format": ({"type": "text"},),
    "echo": (False,),
    "suffix": ("",),
    "best_of": (1,),
    "service_tier": ("auto", "default"),
    "store": (False,),
    "metadata": ({},),
    "modalities": (["text"],),
    "audio": (),
    "prediction": (),
    "reasoning_effort": (),
    "web_search_options": (),
}


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TextPart(Strict):
    type: Literal["text"]
    text: str


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    refusal: None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: object) -> object:
        if isinstance(value, list):
            for part in value:
                if isinstance(part, dict) and part.get("type") != "text":
                    raise ValueError(
                        f"content parts of type {part.get('type')!r} are not supported"
                    )
        return value

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(Strict):
    include_usage: bool = False


def needs(field: str, off: dict[str, Any], value: object, on: str) -> dict[str, Any]:
    """The JSON schema of "`field` is absent or `off`, unless `on` is `value`"."""
    return {
        "anyOf": [
            {"properties": {field: off}},  # absent, or off
            {"properties": {on: {"const": value}}, "required": [on]},
        ]
    }


# What the request schema says of the parameters the server refuses without another one.
DEPENDENCIES: dict[str, Any] = {
    "allOf": [
        needs("stream_options", {"type": "null"}, True, "stream"),
        needs("provenance", {"not": {"const": True}}, True, "stream"),
        needs("rejected_drafts", {"not": {"const": True}}, True, "provenance"),
    ]
}


class Sampling(Strict):
    model_config = ConfigDict(json_schema_extra=DEPENDENCIES)

    model: str = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    # OpenAI's default and range; NaN and infinities are refused as not finite.
    temperature: float = Field(1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=-(2**63), lt=2**63)
    stop: str | list[str] | None = None
    n: int = Field(1, ge=1)
    user: str | None = Field(None, max_length=256)
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculation: Speculation | None = Field(
        None,
        description="This server's own: the request's speculative decoding. off: the target "
        "alone, one token per step; ngram: prompt lookup, the request's own earlier tokens "
        "that followed its last few; dflash: the DFlash drafter's top-1 block; dcoco: the "
        "drafter's top-K per slot, re-selected by the DCOCO corrector. Null: the model's "
        "default. A model whose workers cannot run the value answers 400 (see /v1/models).",
    )
    provenance: bool = Field(
        False,
        description="This server's own, streams only: each chunk's choice carries "
        "`provenance`, every token of the chunk with its text and where it came from "
        "(drafted, corrected, target), and the verification cycle. 400 where the model's "
        "engine cannot tell (vLLM).",
    )
    rejected_drafts: bool = Field(
        False,
        description="This server's own, with provenance: also the draft tokens the target "
        "rejected in the chunk's cycle.",
    )

    @field_validator("stop")
    @classmethod
    def _stops(cls, value: str | list[str] | None) -> str | list[str] | None:
        stops = [value] if isinstance(value, str) else value or []
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences")
        if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop sequences must have 1 to {MAX_STOP_CHARS} characters")
        return value

    def budget(self) -> int | None:
        """max_tokens as asked (None: the rest of the context)."""
        raise NotImplementedError

    def prompt_count(self) -> int:
        raise NotImplementedError

    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())

    def wants_usage_chunk(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)

    def budget(self) -> int | None:
        if (
            self.max_tokens
            and self.max_completion_tokens
            and self.max_tokens != self.max_completion_tokens
        ):
            raise InvalidRequest("max_tokens and max_completion_tokens differ", param="max_tokens")
        return self.max_completion_tokens or self.max_tokens

    def prompt_count(self) -> int:
        return 1


TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


class CompletionRequest(Sampling):
    prompt: (
        str
        | Annotated[list[str], Field(min_length=1)]
        | TokenIds
        | Annotated[list[TokenIds], Field(min_length=1)]
    )

    def budget(self) -> int | None:
        return self.max_tokens

    def prompt_count(self) -> int:
        """A string or one list of token ids is one prompt; a list of either is several."""
        prompt = self.prompt
        if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
            return 1
        return len(prompt)


S = TypeVar("S", bound=Sampling)


def parse(model: type[S], body_bytes: bytes) -> S:
    """Decodes and validates a JSON body; every problem is an InvalidRequest naming the field.

    The decoder refuses what would break later stages: invalid UTF-8, lone surrogates
    ("\\ud800", which no tokenizer or Redis client can encode) and nesting deeper than it
    recurses.
    """
    try:
        raw = pydantic_core.from_json(body_bytes)
    except ValueError as bad:
        raise InvalidRequest(f"the request body is not valid JSON: {bad}") from None
    if not isinstance(raw, dict):
        raise InvalidRequest("the request body must be a JSON object")
    body = dict(raw)
    for name, neutral in NEUTRAL.items():
        if name in body:
            value = body.pop(name)
            if value is not None and value not in neutral:
                raise Unsupported(f"'{name}' is not supported by this server", param=name)
    try:
        request = model.model_validate(body)
    except ValidationError as bad:
        first = bad.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = "unknown parameter" if first["type"] == "extra_forbidden" else first["msg"]
        raise InvalidRequest(f"{where}: {message}", param=where or None) from None
    if request.stream_options is not None and not request.stream:
        raise InvalidRequest(
            "stream_options is only allowed with stream: true", param="stream_options"
        )
    if request.provenance and not request.stream:
        raise InvalidRequest(
            "provenance is carried by stream chunks: it needs stream: true", param="provenance"
        )
    if request.rejected_drafts and not request.provenance:
        raise InvalidRequest(
            "rejected_drafts is part of the provenance: it needs provenance: true",
            param="rejected_drafts",
        )
    return request
