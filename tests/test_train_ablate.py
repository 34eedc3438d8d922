"""Corrector ablations: the removed pathway stays at zero through training, the rest learns, and
the ablated corrector really ignores what it lost."""

import torch

from dcoco.train.run_ablate import REMOVED, Ablation, ablate
from factories import make_drafter, make_target


def trained_copy(ablation: Ablation) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    drafter = make_drafter(make_target())
    corrector = drafter.corrector
    assert corrector is not None
    ablate(corrector, ablation)
    before = {n: p.detach().clone() for n, p in corrector.named_parameters()}
    optimizer = torch.optim.AdamW(corrector.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        hidden = torch.randn(4, 5, drafter.config.model.hidden_size, generator=g)  # [R, B, H]
        ids = torch.randint(0, 16, (4, 5, corrector.config.top_k), generator=g)  # [R, B, K]
        logits = torch.randn(4, 5, corrector.config.top_k, generator=g)  # [R, B, K]
        embed = torch.randn(16, drafter.config.model.hidden_size, generator=g)  # [V, E]
        optimizer.zero_grad()
        corrector(hidden, ids, logits, embed).square().mean().backward()
        optimizer.step()
    return before, {n: p.detach() for n, p in corrector.named_parameters()}


def test_each_ablation_keeps_its_pathway_at_zero_and_trains_the_rest() -> None:
    for ablation in (Ablation.NO_PAIR, Ablation.NO_REP):
        before, after = trained_copy(ablation)
        removed = [n for n in after if n.startswith(REMOVED[ablation])]
        assert removed
        for name, value in after.items():
            if name in removed:
                assert not value.any(), name
            elif name.startswith(("delta_out.", "delta_from.", "rep_token.")):
                assert not torch.equal(before[name], value), name


def test_without_the_pair_state_scores_ignore_the_neighbouring_slot() -> None:
    drafter = make_drafter(make_target())
    corrector = drafter.corrector
    assert corrector is not None
    ablate(corrector, Ablation.NO_PAIR)
    with torch.no_grad():
        corrector.rep_slot.weight.zero_()  # and z without the slot: only tokens remain
        corrector.rep_slot.bias.zero_()
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(2, 5, drafter.config.model.hidden_size, generator=g)  # [R, B, H]
    ids = torch.randint(0, 16, (2, 5, corrector.config.top_k), generator=g)  # [R, B, K]
    logits = torch.randn(2, 5, corrector.config.top_k, generator=g)  # [R, B, K]
    embed = torch.randn(16, drafter.config.model.hidden_size, generator=g)  # [V, E]
    with torch.no_grad():
        scores = corrector(hidden, ids, logits, embed)  # [R, B-1, K, K]
        moved = corrector(hidden + 5.0 * torch.randn_like(hidden), ids, logits, embed)
    torch.testing.assert_close(scores, moved)
    assert scores.sub(logits[:, 1:].unsqueeze(2)).abs().max() > 0  # Delta still acts
