"""Training losses: DFlash's block cross-entropy and DCOCO's correction loss.

Both weigh slots by depth because verification reads a draft front to back and stops at the
first miss: slot p only pays if slots 0..p-1 were accepted.
"""

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dcoco.spec.corrector import Corrector
from dcoco.spec.select import Candidates, token_ids

IGNORE = -100


def block_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, decay: float) -> torch.Tensor:
    """Cross-entropy per slot weighted by exp(-p / decay), averaged over labelled slots.

    logits [..., B, V], labels [..., B] (IGNORE where the sequence has ended).
    """
    slots = labels.shape[-1]
    weight = torch.exp(-torch.arange(slots, dtype=torch.float32) / decay)  # [B]
    losses = F.cross_entropy(
        logits.flatten(0, -2).float(), labels.flatten(), ignore_index=IGNORE, reduction="none"
    ).view_as(labels)  # [..., B]
    weights = weight * (labels != IGNORE)  # [..., B]
    return (losses * weights).sum() / weights.sum().clamp(min=1e-6)  # scalar


@dataclass(frozen=True)
class PairTargets:
    """Where the verifier's tokens sit among the candidates of adjacent slots."""

    source: torch.Tensor  # [R, B-1] candidate index of the label at slot p
    target: torch.Tensor  # [R, B-1] candidate index of the label at slot p + 1
    reachable: torch.Tensor  # [R, B-1] the prefix-first walk can reach pair p on the labels


def pair_targets(cand_ids: torch.Tensor, labels: torch.Tensor) -> PairTargets:
    """cand_ids [R, B, K], labels [R, B] -> the supervised transitions.

    A pair counts only when the walk, starting from candidate 0 at slot 0, could have stayed on
    the verifier's tokens up to slot p + 1: slot 0's label is the top-1 and every label up to
    p + 1 is among its slot's candidates. Anything later is never examined by verification.
    """
    hit = cand_ids == labels.unsqueeze(-1)  # [R, B, K]
    index = hit.int().argmax(-1)  # [R, B], 0 where absent (masked below)
    present = hit.any(-1) & (labels != IGNORE)  # [R, B]
    on_path = present.clone()  # [R, B]
    on_path[:, 0] &= index[:, 0] == 0
    on_path = on_path.int().cumprod(1).bool()  # [R, B]
    return PairTargets(source=index[:, :-1], target=index[:, 1:], reachable=on_path[:, 1:])


def correction_loss(scores: torch.Tensor, targets: PairTargets, decay: float) -> torch.Tensor:
    """Cross-entropy over successors b of S_p[label_p, b], weighted by decay**p.

    scores [R, B-1, K, K]. Each row's weighted sum is divided by the total weight of a row
    whose every pair is reachable, so an unreachable pair contributes nothing, and an error at
    pair p costs decay**p times an error at pair 0.
    """
    rows, pairs, k, _ = scores.shape
    from_label = targets.source.view(rows, pairs, 1, 1).expand(rows, pairs, 1, k)  # [R, B-1, 1, K]
    successors = scores.gather(2, from_label).squeeze(2)  # [R, B-1, K]
    losses = F.cross_entropy(
        successors.flatten(0, 1).float(), targets.target.flatten(), reduction="none"
    ).view(rows, pairs)  # [R, B-1]
    weight = decay ** torch.arange(pairs, dtype=torch.float32)  # [B-1]
    weighted = losses * weight * targets.reachable  # [R, B-1]
    return weighted.sum() / (rows * weight.sum())  # scalar


def corrector_scores(
    corrector: Corrector,
    hidden: torch.Tensor,
    logits: torch.Tensor,
    embed_weight: torch.Tensor,
    vocab_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The engine's correction step with gradients: hidden [R, B, H], logits [R, B, V'] ->
    candidate token ids [R, B, K] and scores [R, B-1, K, K]. The candidates are picked without
    gradient; their logits carry it back into the drafter. `vocab_ids` [V'] maps the logits'
    columns to token ids when they range over part of the vocabulary."""
    places = Candidates.top_k(logits.detach(), corrector.config.top_k).ids  # [R, B, K]
    cand_logits = logits.gather(-1, places)  # [R, B, K]
    ids = token_ids(places, vocab_ids)  # [R, B, K]
    return ids, corrector(hidden, ids, cand_logits, embed_weight)  # [R, B-1, K, K]
