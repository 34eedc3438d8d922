"""Selection rules: turn transition scores S [R, B-1, K, K] into one draft per row.

- prefix-first (the default): keep slot 0's top-1, then repeatedly take the best successor of
  the candidate just chosen. It mirrors verification, which reads the draft front to back and
  stops at the first miss, so a strong late transition can never buy a weak early one.
- global: the Viterbi path maximising l[0, a_0] + sum_p S_p[a_p, a_{p+1}].
- discounted: the same with S_p weighted by gamma**p, which leans towards the prefix.
"""

from dataclasses import dataclass

import numpy as np
import torch

from dcoco.shared.options import Rule


@dataclass(frozen=True)
class Candidates:
    ids: torch.Tensor  # [R, B, K] token ids, best first
    logits: torch.Tensor  # [R, B, K] the drafter's logits for them

    @classmethod
    def top_k(
        cls, logits: torch.Tensor, k: int, vocab_ids: torch.Tensor | None = None
    ) -> "Candidates":
        """logits [R, B, V'] -> the K best per slot; `vocab_ids` [V'] maps the columns to
        token ids when the logits range over a drafting vocabulary (None: columns are ids)."""
        values, places = logits.topk(k, dim=-1)  # [R, B, K] each, sorted descending
        return cls(ids=token_ids(places, vocab_ids), logits=values)


def token_ids(places: torch.Tensor, vocab_ids: torch.Tensor | None) -> torch.Tensor:
    """Logit columns [...] -> token ids [...] through a drafting vocabulary's ids [V']."""
    return places if vocab_ids is None else vocab_ids[places]  # [...]


@dataclass(frozen=True)
class Selection:
    index: torch.Tensor  # [R, B] chosen candidate per slot; 0 is the drafter's top-1
    tokens: torch.Tensor  # [R, B] the draft


def select(rule: Rule, scores: torch.Tensor, cands: Candidates, gamma: float = 0.5) -> Selection:
    if rule is Rule.PREFIX:
        index = prefix_first(scores)
    else:
        index = viterbi(scores, cands.logits[:, 0], gamma if rule is Rule.DISCOUNTED else 1.0)
    tokens = cands.ids.gather(-1, index.unsqueeze(-1)).squeeze(-1)  # [R, B]
    return Selection(index=index, tokens=tokens)


def prefix_first(scores: torch.Tensor) -> torch.Tensor:
    """scores [R, B-1, K, K] -> candidate index [R, B], starting from candidate 0.

    One batched argmax builds the best-successor table; the walk is then pointer chasing
    through it on the host, with a single transfer and no per-slot tensor ops.
    """
    successor = scores.argmax(-1).cpu().numpy()  # [R, B-1, K]
    rows, slots = successor.shape[0], successor.shape[1] + 1
    index = np.zeros((rows, slots), dtype=np.int64)  # [R, B]
    every_row = np.arange(rows)
    for p in range(slots - 1):
        index[:, p + 1] = successor[every_row, p, index[:, p]]
    return torch.from_numpy(index).to(scores.device)  # [R, B]


def viterbi(scores: torch.Tensor, first: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Maximum of first[a_0] + sum_p gamma**p * scores[p, a_p, a_{p+1}].

    scores [R, B-1, K, K], first [R, K] -> candidate index [R, B].
    """
    best = first  # [R, K] best path score ending in each candidate of the current slot
    backpointers = []
    for p in range(scores.shape[1]):
        paths = best.unsqueeze(2) + gamma**p * scores[:, p]  # [R, K from, K to]
        previous = paths.argmax(1)  # [R, K]
        best = paths.gather(1, previous.unsqueeze(1)).squeeze(1)  # [R, K]
        backpointers.append(previous)
    chosen = [best.argmax(-1)]  # [R] at the last slot
    for previous in reversed(backpointers):
        chosen.append(previous.gather(1, chosen[-1].unsqueeze(1)).squeeze(1))  # [R]
    return torch.stack(chosen[::-1], dim=1)  # [R, B]
