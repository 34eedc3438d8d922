"""One request's state inside the engine."""

from dataclasses import dataclass, field

import torch

from dcoco.shared.options import Mode
from dcoco.shared.sampling import SamplingParams
from dcoco.shared.stats import SpecStats
from dcoco.spec.ngram import Draft, NgramIndex


@dataclass
class Sequence:
    """Tokens, cache bookkeeping and stop state of one request.

    Invariant while running: the target KV cache holds positions 0..num_cached-1, and the last
    token (position num_cached) is pending, not yet cached. The drafter context holds the same
    positions but the last P, whose target features wait in `pending_context` until the next
    draft of this sequence writes them (`ModelRunner.flush_context`): a plain step does not
    pay for a drafter pass it may never use.
    """

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams
    max_model_len: int
    stop_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    slot: int = -1
    num_cached: int = 0
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stats: SpecStats = field(default_factory=SpecStats)
    sample_key: int = 0  # keys the uniforms of its sampled tokens (`engine/uniforms.py`)
    mode: Mode = Mode.VANILLA  # how its cycles draft: the request's speculation
    pending_context: list[torch.Tensor] = field(default_factory=list)  # [T, F] chunks, in order
    ngrams: NgramIndex | None = None  # for prompt lookup, built on the first (`lookup`)

    @property
    def pending_positions(self) -> int:
        """P: the positions cached in the target whose drafter context is not yet written."""
        return sum(len(chunk) for chunk in self.pending_context)

    @property
    def length(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def last_token(self) -> int:
        return self.output_ids[-1] if self.output_ids else self.prompt_ids[-1]

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def lookup(self, k: int) -> Draft:
        """Its prompt-lookup draft of up to k tokens (`spec/ngram.py`); the index behind it is
        kept and extended by the tokens committed since the last lookup."""
        if self.ngrams is None:
            self.ngrams = NgramIndex()
        seen, prompt = len(self.ngrams.tokens), len(self.prompt_ids)
        self.ngrams.extend(self.prompt_ids[seen:] + self.output_ids[max(0, seen - prompt) :])
        return self.ngrams.draft(k)

    def append(self, tokens: list[int]) -> list[int]:
        """Adds committed tokens up to the first stop condition; returns those kept."""
        kept = []
        for token in tokens:
            self.output_ids.append(token)
            kept.append(token)
            if token in self.stop_ids:
                self.finish_reason = "stop"
            elif (
                len(self.output_ids) >= self.params.max_tokens or self.length >= self.max_model_len
            ):
                self.finish_reason = "length"
            if self.finished:
                break
        return kept
