import pytest
import torch
import torch.nn.functional as F

from dcoco.spec.corrector import Corrector, CorrectorConfig
from dcoco.spec.select import Candidates, Rule, select


def random_pass(
    rows: int, slots: int, vocab: int, hidden: int, seed: int
) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    slot_hidden = torch.randn(rows, slots, hidden, generator=g)  # [R, B, H]
    logits = torch.randn(rows, slots, vocab, generator=g) * 3  # [R, B, V]
    embed = torch.randn(vocab, hidden, generator=g)  # [V, H]
    return slot_hidden, logits, embed


@pytest.mark.parametrize("rule", list(Rule))
@pytest.mark.parametrize(("rows", "slots", "k"), [(1, 2, 1), (3, 5, 4), (7, 15, 16), (16, 15, 16)])
def test_zero_initialised_corrector_reproduces_the_dflash_draft(
    rule: Rule, rows: int, slots: int, k: int
) -> None:
    torch.manual_seed(rows * 100 + slots)
    slot_hidden, logits, embed = random_pass(
        rows, slots, vocab=50, hidden=24, seed=rows + slots + k
    )
    corrector = Corrector(CorrectorConfig(top_k=k, rep_dim=8, pair_dim=8, mlp_dim=4), 24, 24)
    cands = Candidates.top_k(logits, k)
    scores = corrector(slot_hidden, cands.ids, cands.logits, embed)  # [R, B-1, K, K]
    chosen = select(rule, scores, cands, gamma=0.7)
    assert torch.equal(chosen.tokens, logits.argmax(-1))
    assert torch.equal(chosen.index, torch.zeros(rows, slots, dtype=torch.long))


def test_batched_scores_equal_a_naive_loop_over_pairs_and_candidates() -> None:
    rows, slots, k, hidden = 2, 4, 3, 12
    slot_hidden, logits, embed = random_pass(rows, slots, vocab=30, hidden=hidden, seed=5)
    corrector = Corrector(
        CorrectorConfig(top_k=k, rep_dim=6, pair_dim=5, mlp_dim=7), hidden, hidden
    )
    torch.nn.init.normal_(corrector.delta_out.weight)
    torch.nn.init.normal_(corrector.delta_out.bias)
    cands = Candidates.top_k(logits, k)
    batched = corrector(slot_hidden, cands.ids, cands.logits, embed)
    c = corrector

    def z(r: int, p: int, a: int) -> torch.Tensor:
        return F.silu(c.rep_token(embed[cands.ids[r, p, a]]) + c.rep_slot(slot_hidden[r, p]))

    naive = torch.empty(rows, slots - 1, k, k)
    for r in range(rows):
        for p in range(slots - 1):
            s = F.silu(c.pair(torch.cat([slot_hidden[r, p], slot_hidden[r, p + 1]])))
            for a in range(k):
                for b in range(k):
                    h = F.relu(
                        c.delta_from(z(r, p, a)) + c.delta_to(z(r, p + 1, b)) + c.delta_pair(s)
                    )
                    naive[r, p, a, b] = cands.logits[r, p + 1, b] + c.delta_out(h)[0]
    torch.testing.assert_close(batched, naive, rtol=1e-5, atol=1e-5)
    with torch.no_grad():  # the inference path gathers from a whole-vocabulary token table
        torch.testing.assert_close(
            corrector(slot_hidden, cands.ids, cands.logits, embed), naive, rtol=1e-5, atol=1e-5
        )
        torch.nn.init.normal_(corrector.rep_token.weight)  # an update rebuilds the table
        changed = corrector(slot_hidden, cands.ids, cands.logits, embed)
    torch.testing.assert_close(changed, corrector(slot_hidden, cands.ids, cands.logits, embed))


def test_a_trained_corrector_changes_some_choices() -> None:
    slot_hidden, logits, embed = random_pass(8, 15, vocab=64, hidden=24, seed=11)
    corrector = Corrector(CorrectorConfig(top_k=8, rep_dim=8, pair_dim=8, mlp_dim=8), 24, 24)
    torch.nn.init.normal_(corrector.delta_out.weight, std=5.0)
    cands = Candidates.top_k(logits, 8)
    chosen = select(Rule.PREFIX, corrector(slot_hidden, cands.ids, cands.logits, embed), cands)
    assert (chosen.index != 0).any()
    assert (chosen.index[:, 0] == 0).all()
