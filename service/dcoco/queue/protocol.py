"""What travels through Redis: request envelopes, response events and model cards.

Everything is JSON validated by pydantic on the way in, so a malformed entry written by anyone
is rejected with a reason instead of crashing the reader.
"""

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# What a request may ask for: `Mode.speculation`.
Speculation = Literal["off", "ngram", "dflash", "dcoco"]


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GenerationParams(Frozen):
    max_tokens: int = Field(ge=1)
    temperature: float = Field(ge=0.0)
    top_p: float = Field(gt=0.0, le=1.0)
    seed: int | None = None
    stop: tuple[str, ...] = ()  # stop strings; the text stops before the first match


class Envelope(Frozen):
    """One request as the gateway enqueues it: the prompt is already tokenized."""

    id: str = Field(min_length=1, max_length=128)
    model: str
    prompt_ids: tuple[int, ...] = Field(min_length=1)
    params: GenerationParams
    enqueued_at: float  # unix seconds
    deadline: float  # unix seconds; a worker picking it up later does not run it
    # The request's own speculation (None: the worker's DCOCO_MODE), and whether its delta
    # events carry each token's provenance, its cycle and the cycle's rejected draft.
    speculation: Speculation | None = None
    provenance: bool = False

    def expired(self, now: float | None = None) -> bool:
        return (time.time() if now is None else now) > self.deadline


class Usage(Frozen):
    prompt_tokens: int
    completion_tokens: int
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class ErrorInfo(Frozen):
    status: int  # the HTTP status the gateway answers with
    code: str
    message: str


class Event(Frozen):
    """One response event. `seq` counts a request's delta, done and error events across
    attempts; `attempt` says which delivery wrote it (a reclaimed request continues with
    attempt + 1). A "start" event (seq -1) says a worker has taken the request up. A delta
    carries the speculation behind it (drafted tokens accepted and rejected since its attempt's
    previous delta), so that a reclaiming worker's usage can count the earlier attempts'."""

    kind: Literal["start", "delta", "done", "error"]
    seq: int
    attempt: int
    text: str = ""
    token_ids: tuple[int, ...] = ()
    accepted: int = 0
    rejected: int = 0
    # With Envelope.provenance, where the engine can tell: per token "drafted" (the drafter's
    # top-1, accepted), "corrected" (re-selected by the corrector, accepted) or "target";
    # the request's cycle these tokens came from; that cycle's draft past what was used.
    provenance: tuple[Literal["drafted", "corrected", "target"], ...] = ()
    cycle: int | None = None
    rejected_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    usage: Usage | None = None
    error: ErrorInfo | None = None


class ModelCard(BaseModel):
    """What a gateway needs to accept requests for a model; workers publish it.

    Unknown fields are ignored, so that a gateway reads the cards of newer workers during a
    rolling upgrade. The capabilities have defaults that mean "not said" (cards of older
    workers): the gateway then passes a request's choices on and the worker decides."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    name: str
    max_model_len: int
    tokenizer_sha: str
    chat_template: str | None
    created: int
    engine: Literal["torch", "vllm", "instant"] | None = None
    # The speculation the worker runs when a request names none, and every one a request may
    # name (empty: not said).
    default_speculation: Speculation | None = None
    speculation: tuple[Speculation, ...] = ()
    # Whether delta events carry each token's provenance, cycle and rejected draft when the
    # envelope asks (the torch engine); False where the engine cannot tell (vLLM); None: not said.
    provenance: bool | None = None
