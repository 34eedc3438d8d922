"""The tokens a drafter's training softmax ranges over.

The lm_head is most of a drafter step's cost: with SmolLM2's 49,152 tokens it is 90% of the
matrix products. The labels are the target's own answers, which use a fraction of the
vocabulary, so training may rank only the most frequent answer tokens (as EAGLE-3 drafts over a
reduced vocabulary). A slot whose label falls outside is left out of the loss. The exported
drafters draft over the same tokens (`DFlashDrafter.with_vocab`).
"""

from dataclasses import dataclass

import torch

from dcoco.train.data import Continuations
from dcoco.train.losses import IGNORE


@dataclass(frozen=True)
class TrainVocab:
    ids: torch.Tensor  # [Vs] token ids, most frequent first
    index: torch.Tensor  # [V] each token's place in ids, -1 outside

    @classmethod
    def full(cls, vocab: int) -> "TrainVocab":
        every = torch.arange(vocab)  # [V]
        return cls(every, every)

    @classmethod
    def frequent(cls, data: Continuations, vocab: int, size: int) -> "TrainVocab":
        """The `size` tokens that occur most often in the continuations (not the prompts)."""
        positions = torch.arange(data.tokens.shape[1])  # [T]
        answer = (positions >= data.prompt_lens.unsqueeze(1)) & (
            positions < data.lengths.unsqueeze(1)
        )  # [S, T]
        counts = torch.bincount(data.tokens[answer], minlength=vocab)  # [V]
        ids = counts.argsort(descending=True)[: min(size, vocab)]  # [Vs]
        return cls.of_ids(ids, vocab)

    @classmethod
    def of_ids(cls, ids: torch.Tensor, vocab: int) -> "TrainVocab":
        """The vocabulary of token ids [Vs], in that order: a shipped drafter's columns."""
        index = torch.full((vocab,), -1, dtype=torch.long)  # [V]
        index[ids] = torch.arange(len(ids))
        return cls(ids, index)

    def logits(self, hidden: torch.Tensor, lm_head: torch.Tensor) -> torch.Tensor:
        """hidden [..., H], lm_head weight [V, H] -> logits over the kept tokens [..., Vs]."""
        return hidden @ lm_head[self.ids].T  # [..., Vs]

    def labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Token labels [...] -> places in ids, IGNORE where outside or already ignored."""
        place = self.index[labels.clamp(min=0)]  # [...]
        return torch.where((labels == IGNORE) | (place < 0), IGNORE, place)  # [...]

    def share(self, data: Continuations) -> float:
        """The share of answer tokens the kept tokens cover."""
        positions = torch.arange(data.tokens.shape[1])  # [T]
        answer = (positions >= data.prompt_lens.unsqueeze(1)) & (
            positions < data.lengths.unsqueeze(1)
        )  # [S, T]
        return float((self.index[data.tokens[answer]] >= 0).float().mean())
