import math

import pytest
import torch

from dcoco.spec.corrector import Corrector, CorrectorConfig
from dcoco.train.loop import MIN_LR_FRACTION, Budget
from dcoco.train.losses import (
    IGNORE,
    block_cross_entropy,
    correction_loss,
    corrector_scores,
    pair_targets,
)

B, K, V = 5, 3, 8


def logits_for(tokens: list[int], vocab: int = V) -> torch.Tensor:
    """[1, B, V] logits whose argmax at slot p is tokens[p], by a margin of 4."""
    out = torch.zeros(1, len(tokens), vocab)
    out[0, torch.arange(len(tokens)), torch.tensor(tokens)] = 4.0
    return out


def test_block_cross_entropy_weighs_slot_p_by_exp_minus_p_over_decay() -> None:
    labels = torch.tensor([[1, 2, 3, 4, 5]])
    right = logits_for([1, 2, 3, 4, 5])
    base = block_cross_entropy(right, labels, decay=2.0)
    errors = []
    for p in (0, 3):
        wrong = right.clone()
        wrong[0, p] = logits_for([0] * B)[0, p]  # slot p now prefers token 0
        errors.append(block_cross_entropy(wrong, labels, decay=2.0) - base)
    assert errors[1] / errors[0] == pytest.approx(math.exp(-3 / 2.0), rel=1e-4)


def test_block_cross_entropy_ignores_slots_past_the_end() -> None:
    labels = torch.tensor([[1, 2, IGNORE, IGNORE, IGNORE]])
    logits = logits_for([1, 2, 0, 0, 0])
    garbage = logits.clone()
    garbage[0, 2:] = torch.randn(3, V) * 10
    assert block_cross_entropy(logits, labels, 7.0) == block_cross_entropy(garbage, labels, 7.0)


def candidates(rows: list[list[list[int]]]) -> torch.Tensor:
    return torch.tensor(rows)  # [R, B, K]


CANDS = candidates([[[1, 9, 8], [2, 7, 6], [5, 3, 4], [4, 0, 1], [6, 5, 2]]])  # [1, 5, 3]


def test_pairs_are_reachable_only_along_the_prefix_the_walk_can_follow() -> None:
    # labels: slot 0 top-1, slot 1 top-1, slot 2 third candidate, slot 3 absent, slot 4 present
    targets = pair_targets(CANDS, torch.tensor([[1, 2, 4, 7, 6]]))
    assert targets.reachable.tolist() == [[True, True, False, False]]
    assert targets.source[0, :2].tolist() == [0, 0]
    assert targets.target[0, :2].tolist() == [0, 2]
    # slot 0's label is not the top-1: the walk starts there, so nothing is reachable
    assert not pair_targets(CANDS, torch.tensor([[9, 2, 5, 4, 6]])).reachable.any()
    # an ignored label ends the path like an absent one
    ended = pair_targets(CANDS, torch.tensor([[1, 2, 5, IGNORE, IGNORE]]))
    assert ended.reachable.tolist() == [[True, True, False, False]]


def test_the_correction_loss_weighs_pair_p_by_decay_to_the_p() -> None:
    labels = torch.tensor([[1, 2, 5, 4, 6]])  # every label is a top-1: all pairs reachable
    targets = pair_targets(CANDS, labels)
    assert targets.reachable.all()
    right = torch.zeros(1, B - 1, K, K)
    right[..., 0] = 5.0  # every transition prefers the top-1 successor, as the labels do
    base = correction_loss(right, targets, decay=0.5)
    errors = []
    for p in (0, 1, 3):
        wrong = right.clone()
        wrong[0, p, 0] = torch.tensor([0.0, 5.0, 0.0])  # pair p now prefers candidate 1
        errors.append(float(correction_loss(wrong, targets, decay=0.5) - base))
    assert errors[1] / errors[0] == pytest.approx(0.5, rel=1e-4)
    assert errors[2] / errors[0] == pytest.approx(0.5**3, rel=1e-4)


def test_unreachable_pairs_cost_nothing() -> None:
    targets = pair_targets(CANDS, torch.tensor([[1, 2, 4, 7, 6]]))  # pairs 2, 3 unreachable
    scores = torch.zeros(1, B - 1, K, K)
    noisy = scores.clone()
    noisy[0, 2:] = torch.randn(2, K, K) * 10
    assert correction_loss(scores, targets, 0.8) == correction_loss(noisy, targets, 0.8)


def test_corrector_scores_carry_gradient_into_the_drafter_logits() -> None:
    torch.manual_seed(0)
    corrector = Corrector(CorrectorConfig(top_k=K, rep_dim=4, pair_dim=4, mlp_dim=4), 6, 6)
    hidden = torch.randn(2, B, 6, requires_grad=True)
    logits = torch.randn(2, B, V, requires_grad=True)
    ids, scores = corrector_scores(corrector, hidden, logits, torch.randn(V, 6))
    assert ids.shape == (2, B, K)
    assert scores.shape == (2, B - 1, K, K)
    labels = ids[..., 0]  # the top-1 everywhere: every pair reachable
    correction_loss(scores, pair_targets(ids, labels), 0.8).backward()
    assert logits.grad is not None
    assert logits.grad.abs().sum() > 0
    assert corrector.delta_out.weight.grad is not None


def test_the_budget_ends_on_steps_or_time_and_anneals_to_ten_percent() -> None:
    budget = Budget(budget_s=1e9, max_steps=100, warmup_steps=10)
    assert budget.lr_scale() == pytest.approx(0.1)  # first warm-up step
    budget.steps = 10  # warm-up over, cosine decay 10% of the way in
    cosine = 0.5 * (1 + math.cos(math.pi * 0.1))
    assert budget.lr_scale() == pytest.approx(MIN_LR_FRACTION + (1 - MIN_LR_FRACTION) * cosine)
    budget.steps = 50
    assert budget.progress == pytest.approx(0.5)
    budget.steps = 100
    assert budget.progress == 1.0
    assert budget.lr_scale() == pytest.approx(MIN_LR_FRACTION)
    timed = Budget(budget_s=1e-9, max_steps=10**9, warmup_steps=0)
    assert timed.progress == 1.0
