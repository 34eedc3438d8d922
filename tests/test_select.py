import itertools

import pytest
import torch

from dcoco.spec.select import Candidates, Rule, prefix_first, select, viterbi


def candidates(rows: int, slots: int, k: int) -> Candidates:
    ids = torch.arange(slots * k).view(1, slots, k).repeat(rows, 1, 1)  # [R, B, K] distinct
    logits = -torch.arange(k, dtype=torch.float).expand(rows, slots, k)  # [R, B, K] sorted
    return Candidates(ids=ids, logits=logits.clone())


def test_the_walk_always_starts_at_the_top_candidate() -> None:
    scores = torch.randn(6, 7, 5, 5, generator=torch.Generator().manual_seed(0))
    assert (prefix_first(scores)[:, 0] == 0).all()


def test_the_walk_follows_the_best_successor_of_the_token_it_just_chose() -> None:
    # slot 0 -> 1: from candidate 0 the best successor is 1.
    # slot 1 -> 2: candidate 2 has a huge transition to 1, but the walk stands on candidate 1,
    # whose best successor is 0; a late strong transition must not pull the walk over.
    scores = torch.zeros(1, 2, 3, 3)
    scores[0, 0, 0] = torch.tensor([0.0, 5.0, 1.0])
    scores[0, 1, 1] = torch.tensor([2.0, 0.0, 0.0])
    scores[0, 1, 2] = torch.tensor([0.0, 100.0, 0.0])
    cands = candidates(1, 3, 3)
    walk = select(Rule.PREFIX, scores, cands)
    assert walk.index.tolist() == [[0, 1, 0]]
    assert walk.tokens.tolist() == [[0, 4, 6]]
    # The global rule takes the detour the walk refuses: 0 -> 2 -> 1 scores 1 + 100.
    assert select(Rule.GLOBAL, scores, cands).index.tolist() == [[0, 2, 1]]


def brute_force(
    scores: torch.Tensor, first: torch.Tensor, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Best path and its score for each row, by enumerating all K**B paths."""
    rows, pairs, k, _ = scores.shape
    best_paths, best_scores = [], []
    for r in range(rows):
        paths = list(itertools.product(range(k), repeat=pairs + 1))
        totals = [
            first[r, p[0]] + sum(gamma**i * scores[r, i, p[i], p[i + 1]] for i in range(pairs))
            for p in paths
        ]
        winner = int(torch.stack([torch.as_tensor(t) for t in totals]).argmax())
        best_paths.append(paths[winner])
        best_scores.append(totals[winner])
    return torch.tensor(best_paths), torch.stack([torch.as_tensor(s) for s in best_scores])


@pytest.mark.parametrize("gamma", [1.0, 0.5])
@pytest.mark.parametrize(("slots", "k"), [(2, 4), (4, 3), (5, 2)])
def test_viterbi_equals_brute_force(slots: int, k: int, gamma: float) -> None:
    g = torch.Generator().manual_seed(slots * k)
    scores = torch.randn(4, slots - 1, k, k, generator=g, dtype=torch.float64)
    first = torch.randn(4, k, generator=g, dtype=torch.float64)
    expected_path, expected_score = brute_force(scores, first, gamma)
    path = viterbi(scores, first, gamma)
    assert torch.equal(path, expected_path)
    rows = torch.arange(4)
    got = first[rows, path[:, 0]] + sum(
        gamma**i * scores[rows, i, path[:, i], path[:, i + 1]] for i in range(slots - 1)
    )
    torch.testing.assert_close(got, expected_score)


def test_discounted_rule_leans_towards_the_prefix() -> None:
    # Two paths: 0 -> 0 -> 0 gains 3 early; 0 -> 1 -> 1 loses 1 early and gains 6 late.
    scores = torch.zeros(1, 2, 2, 2)
    scores[0, 0, 0] = torch.tensor([3.0, -1.0])
    scores[0, 1, 1, 1] = 6.0
    scores[0, 1, 0, 0] = 0.0
    cands = candidates(1, 3, 2)
    cands.logits.zero_()
    cands.logits[0, 0] = torch.tensor([10.0, 0.0])  # slot 0 clearly prefers candidate 0
    assert select(Rule.GLOBAL, scores, cands).index.tolist() == [[0, 1, 1]]
    assert select(Rule.DISCOUNTED, scores, cands, gamma=0.5).index.tolist() == [[0, 0, 0]]


def test_top_k_candidates_are_sorted_best_first() -> None:
    logits = torch.tensor([[[0.1, 3.0, -2.0, 1.0]]])
    cands = Candidates.top_k(logits, 3)
    assert cands.ids.tolist() == [[[1, 3, 0]]]
    assert cands.logits[0, 0].tolist() == pytest.approx([3.0, 1.0, 0.1])
