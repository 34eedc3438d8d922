"""Expected accepted length under sampling, teacher-forced: the T > 0 counterpart of the
coverage measure's greedy counts.

Along completions the target sampled itself at temperature T, the drafter drafts a block at
every position (`coverage.draft_blocks`). Drafts are deterministic (the top-1, or a corrector
walk), so verification accepts slot i with the target's probability p_i of the drafted token
after the block's context and the drafted tokens before it, and a block's expected accepted
prefix is sum_j prod_{i<=j} p_i. One target pass over every block of a completion, each
attending to the completion's cached prefix and causally to itself, gives every p_i exactly:
what remains random is only which contexts the sampled completions reach.
"""

import torch

from dcoco.eval.coverage import check_rules, draft_blocks
from dcoco.model.causal_lm import CausalLM
from dcoco.shared.options import Rule
from dcoco.spec.drafter import DFlashDrafter
from dcoco.spec.verify import target_probs

CHUNK = 32  # blocks per verification pass: bounds the [n, Hkv, T + B + 1, D] key copies


@torch.no_grad()
def drafted_probs(
    target: CausalLM,
    tokens: torch.Tensor,
    anchors: torch.Tensor,
    drafts: dict[str, torch.Tensor],
    temperature: float,
) -> dict[str, torch.Tensor]:
    """tokens [1, T], anchors [A] (each block's pending-token position), drafts: name ->
    [A, B] -> name -> [A, B], the target's probability at `temperature` of each drafted token
    after tokens[:anchor + 1] and the drafted tokens before it."""
    length = tokens.shape[1]
    prefix: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def keep(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        prefix[layer] = (k, v)  # [1, Hkv, T, D] each
        return k, v

    causal = torch.ones(length, length, dtype=torch.bool).tril().view(1, 1, length, length)
    target(tokens, torch.arange(length).unsqueeze(0), keep, causal)  # fills `prefix`
    return {
        name: torch.cat(
            [
                _block_probs(
                    target,
                    tokens,
                    prefix,
                    anchors[i : i + CHUNK],
                    drafted[i : i + CHUNK],
                    temperature,
                )
                for i in range(0, len(anchors), CHUNK)
            ]
        )  # [A, B]
        for name, drafted in drafts.items()
    }


def _block_probs(
    target: CausalLM,
    tokens: torch.Tensor,
    prefix: dict[int, tuple[torch.Tensor, torch.Tensor]],
    anchors: torch.Tensor,
    drafted: torch.Tensor,
    temperature: float,
) -> torch.Tensor:
    """One verification pass over n blocks, anchors [n] and drafted [n, B] -> [n, B]."""
    n, length, width = len(anchors), tokens.shape[1], drafted.shape[1] + 1
    ids = torch.cat([tokens[0, anchors].unsqueeze(1), drafted], dim=1)  # [n, B+1]
    positions = anchors.unsqueeze(1) + torch.arange(width)  # [n, B+1]
    sees_prefix = torch.arange(length) < anchors.view(n, 1, 1)  # [n, 1, T]
    in_block = torch.ones(width, width, dtype=torch.bool).tril()  # [B+1, B+1]
    mask = torch.cat(
        [sees_prefix.expand(n, width, length), in_block.expand(n, width, width)], dim=-1
    ).unsqueeze(1)  # [n, 1, B+1, T+B+1]

    def attend(layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pk, pv = prefix[layer]  # [1, Hkv, T, D] each
        keys = torch.cat([pk.expand(n, -1, -1, -1), k], dim=2)  # [n, Hkv, T+B+1, D]
        values = torch.cat([pv.expand(n, -1, -1, -1), v], dim=2)  # [n, Hkv, T+B+1, D]
        return keys, values

    hidden, _ = target(ids, positions, attend, mask)  # [n, B+1, H]
    logits = target.logits(hidden[:, :-1])  # [n, B, V]
    probs = target_probs(logits, torch.full((n,), temperature), torch.ones(n))  # [n, B, V]
    return probs.gather(-1, drafted.unsqueeze(-1)).squeeze(-1)  # [n, B]


@torch.no_grad()
def expected_accepted_length(
    target: CausalLM,
    drafter: DFlashDrafter,
    sequences: list[tuple[list[int], list[int]]],
    top_k: int,
    temperature: float,
    rules: tuple[Rule, ...] = (),
    gamma: float = 0.5,
) -> dict[str, float]:
    """sequences: (prompt ids, sampled completion ids) pairs -> 1 + the mean expected accepted
    prefix over the blocks whose B slots all lie inside their completion, for the top-1 draft
    ("top1") and each rule's corrector walk (its name)."""
    check_rules(drafter, rules)
    drafter.cast(target.model.embed_tokens.weight.dtype)
    totals: dict[str, float] = {}
    blocks = 0
    for prompt, completion in sequences:
        if len(completion) < 2:
            continue
        b = draft_blocks(target, drafter, prompt, completion, top_k, rules, gamma)
        full = b.valid.all(1)  # [A]
        if not bool(full.any()):
            continue
        blocks += int(full.sum())
        drafts = {"top1": b.candidates.ids[:, :, 0]} | b.walks  # name -> [A, B]
        kept = {name: drafted[full] for name, drafted in drafts.items()}  # name -> [F, B]
        probs = drafted_probs(target, b.tokens, b.anchors[full], kept, temperature)
        for name, p in probs.items():
            totals[name] = totals.get(name, 0.0) + float(p.cumprod(1).sum())  # [F, B] summed
    return {name: round(1 + total / max(1, blocks), 3) for name, total in totals.items()}
