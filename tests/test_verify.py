import pytest
import torch
from scipy.stats import chisquare

from dcoco.spec.verify import (
    accepted_prefix,
    sample,
    target_probs,
    verify,
    verify_greedy,
    verify_sampled,
)

VOCAB = 8


def logits_for(rows: list[list[int]]) -> torch.Tensor:
    """Target logits [R, T, V] whose argmax at each position is the given token."""
    return torch.nn.functional.one_hot(torch.tensor(rows), VOCAB).float() * 10.0


@pytest.mark.parametrize(
    ("draft", "target", "accepted"),
    [
        ([1, 2, 3], [1, 2, 3, 4], 3),  # all accepted, the bonus is the target's 4
        ([1, 2, 3], [1, 5, 3, 4], 1),  # first miss at slot 1; the bonus is 5
        ([1, 2, 3], [6, 2, 3, 4], 0),  # nothing accepted; one token (6) still commits
        ([1, 2, 3], [1, 2, 7, 4], 2),  # a late match after a miss is worthless
    ],
)
def test_greedy_verification(draft: list[int], target: list[int], accepted: int) -> None:
    verdict = verify_greedy(logits_for([target]), torch.tensor([draft]))
    assert verdict.accepted.tolist() == [accepted]
    assert verdict.tokens[0, : accepted + 1].tolist() == target[: accepted + 1]


def test_accepted_prefix_stops_at_the_first_rejection() -> None:
    accept = torch.tensor([[True, True, False, True], [False, True, True, True], [True] * 4])
    assert accepted_prefix(accept).tolist() == [2, 0, 4]


def test_sample_never_returns_a_zero_weight_token() -> None:
    weights = torch.tensor([[0.0, 0.3, 0.0, 0.7, 0.0]]).repeat(4, 1)
    uniforms = torch.tensor([0.0, 0.3 - 1e-7, 0.3, 1.0 - 1e-9])  # token 1 owns [0, 0.3)
    assert sample(weights, uniforms).tolist() == [1, 1, 3, 3]


def test_top_p_keeps_the_smallest_head_holding_the_mass() -> None:
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))
    probs = target_probs(logits, torch.tensor([1.0]), torch.tensor([0.7]))
    torch.testing.assert_close(probs[0, 0], torch.tensor([0.625, 0.375, 0.0, 0.0]))
    tiny = target_probs(logits, torch.tensor([1.0]), torch.tensor([0.01]))
    torch.testing.assert_close(tiny[0, 0], torch.tensor([1.0, 0.0, 0.0, 0.0]))


def wrong_rule(probs: torch.Tensor, draft: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """A tempting mistake: on rejection resample from p itself, without removing the draft."""
    accepted = accepted_prefix(uniforms[:, :1] < probs[:, 0].gather(1, draft[:, :1]))
    resampled = sample(probs[:, 0], uniforms[:, 2])
    return torch.where(accepted == 1, draft[:, 0], resampled)


def expected(p: torch.Tensor, total: int) -> object:
    p = p.double()
    return (p / p.sum() * total).numpy()


def test_sampled_verification_reproduces_the_target_distribution() -> None:
    """Two slots, many rows: the first committed token must follow p0 and, when the draft's
    first token was kept, the second must follow p1. A chi-square test with 40k samples; the
    same test rejects a wrong residual rule, so it has the power to fail."""
    rows = 40_000
    g = torch.Generator().manual_seed(0)
    p0 = torch.tensor([0.35, 0.25, 0.15, 0.1, 0.06, 0.05, 0.03, 0.01])
    p1 = torch.tensor([0.05, 0.05, 0.4, 0.2, 0.1, 0.1, 0.05, 0.05])
    p2 = torch.full((VOCAB,), 1.0 / VOCAB)
    probs = torch.stack([p0, p1, p2]).expand(rows, 3, VOCAB)  # [R, 3, V]
    draft = torch.tensor([[0, 2]]).expand(rows, 2)  # likely drafts, so both branches occur
    uniforms = torch.rand(rows, 3, generator=g)

    verdict = verify_sampled(probs, draft, uniforms)
    first = verdict.tokens[:, 0]
    observed = torch.bincount(first, minlength=VOCAB).double()
    assert chisquare(observed.numpy(), expected(p0, rows)).pvalue > 1e-3
    kept = first == 0  # the draft's first token was committed, so slot 1 was examined
    second = verdict.tokens[kept, 1]
    observed_second = torch.bincount(second, minlength=VOCAB).double()
    assert chisquare(observed_second.numpy(), expected(p1, int(kept.sum()))).pvalue > 1e-3

    wrong = torch.bincount(wrong_rule(probs, draft, uniforms), minlength=VOCAB).double()
    assert chisquare(wrong.numpy(), expected(p0, rows)).pvalue < 1e-6


def test_mixed_batch_verifies_greedy_rows_greedily() -> None:
    logits = logits_for([[1, 2, 3], [1, 2, 3]])
    draft = torch.tensor([[1, 2], [1, 2]])
    uniforms = torch.full((2, 3), 0.999)  # a sampled row rejects anything below p = 0.999
    verdict = verify(logits, draft, torch.tensor([0.0, 1.0]), torch.tensor([1.0, 1.0]), uniforms)
    assert verdict.accepted.tolist()[0] == 2
    assert verdict.tokens[0].tolist() == [1, 2, 3]
