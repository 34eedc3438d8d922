"""Top-K coverage by slot depth: how often the verifier's token is among the drafter's top-1
and top-K candidates at each slot.

Measured teacher-forced on the target's greedy completions, with a block drafted at every
position of each completion, exactly as the engine would draft it there (the equivalence is
tested in test_drafter.py). Under greedy decoding the token the verifier commits after a
correct prefix is the next token of the completion, so that is the label. From the same
blocks come two accepted lengths: the top-1 draft's, and an oracle walk's that takes the
true token whenever it is among the top K, the ceiling for any re-selection.
"""

from dataclasses import dataclass, field

import torch

from dcoco.model.causal_lm import CausalLM
from dcoco.shared.options import Rule
from dcoco.spec.drafter import DFlashDrafter, teacher_forced_blocks
from dcoco.spec.select import Candidates, select


@dataclass
class Coverage:
    top_k: int
    slots: list[int]  # labelled slots at each depth
    top1: list[int]  # of those, the label was the top-1
    topk: list[int]  # of those, the label was among the top K
    topk_when_top1_wrong: list[int]  # label in the top K where the top-1 was wrong
    blocks: int = 0  # blocks with all B slots labelled, for the accepted lengths
    top1_accepted: int = 0  # sum over those blocks of the top-1 draft's accepted prefix
    oracle_accepted: int = 0  # the same for the oracle walk
    walk_accepted: dict[str, int] = field(default_factory=dict)  # the same per rule's walk

    @classmethod
    def empty(cls, block: int, top_k: int) -> "Coverage":
        return cls(top_k, [0] * block, [0] * block, [0] * block, [0] * block)

    def add(
        self,
        top1_hit: torch.Tensor,
        topk_hit: torch.Tensor,
        valid: torch.Tensor,
        walk_hits: dict[str, torch.Tensor],
    ) -> None:
        """top1_hit, topk_hit, valid [A, B] bool for A blocks; walk_hits: rule -> [A, B]
        bool, where each rule's walk chose the label."""
        for name, hits in (
            ("slots", valid),
            ("top1", top1_hit & valid),
            ("topk", topk_hit & valid),
            ("topk_when_top1_wrong", topk_hit & ~top1_hit & valid),
        ):
            counts = hits.sum(0).tolist()  # [B]
            setattr(self, name, [a + b for a, b in zip(getattr(self, name), counts, strict=True)])
        full = valid.all(1)  # [A]
        self.blocks += int(full.sum())
        self.top1_accepted += int(top1_hit[full].int().cumprod(1).sum())
        self.oracle_accepted += int(topk_hit[full].int().cumprod(1).sum())
        for rule, hits in walk_hits.items():
            accepted = int(hits[full].int().cumprod(1).sum())
            self.walk_accepted[rule] = self.walk_accepted.get(rule, 0) + accepted

    def summary(self) -> dict[str, object]:
        def rate(num: list[int], den: list[int]) -> list[float]:
            return [round(n / d, 4) if d else 0.0 for n, d in zip(num, den, strict=True)]

        misses = [s - t for s, t in zip(self.slots, self.top1, strict=True)]
        blocks = max(1, self.blocks)
        return {
            "top_k": self.top_k,
            "slots": sum(self.slots),
            "top1_by_depth": rate(self.top1, self.slots),
            "topk_by_depth": rate(self.topk, self.slots),
            "topk_given_top1_wrong_by_depth": rate(self.topk_when_top1_wrong, misses),
            "topk_given_top1_wrong": round(sum(self.topk_when_top1_wrong) / max(1, sum(misses)), 4),
            "teacher_forced_accepted_length_top1": round(1 + self.top1_accepted / blocks, 3),
            "teacher_forced_accepted_length_oracle": round(1 + self.oracle_accepted / blocks, 3),
        } | {
            f"teacher_forced_accepted_length_{rule}": round(1 + accepted / blocks, 3)
            for rule, accepted in self.walk_accepted.items()
        }


@dataclass(frozen=True)
class Blocks:
    """The drafts teacher-forced along one completion: a block at every position."""

    tokens: torch.Tensor  # [1, T] prompt and completion
    anchors: torch.Tensor  # [A] each block's pending-token position
    labels: torch.Tensor  # [A, B] the completion's next B tokens (clamped past its end)
    valid: torch.Tensor  # [A, B] the label lies inside the completion
    candidates: Candidates  # [A, B, K] each
    walks: dict[str, torch.Tensor]  # rule -> [A, B] the corrector's draft under that rule


@torch.no_grad()
def draft_blocks(
    target: CausalLM,
    drafter: DFlashDrafter,
    prompt: list[int],
    completion: list[int],
    top_k: int,
    rules: tuple[Rule, ...] = (),
    gamma: float = 0.5,
) -> Blocks:
    """Every block the drafter would draft along prompt + completion (at least 2 tokens)."""
    block = drafter.config.block_size
    tokens = torch.tensor([prompt + completion])  # [1, T]
    length = tokens.shape[1]
    anchors = torch.arange(len(prompt), length - 1).unsqueeze(0)  # [1, A] pending tokens
    positions = torch.arange(length).unsqueeze(0)  # [1, T]
    _, feats = target(tokens, positions, feature_layers=drafter.config.target_layer_ids)
    assert feats is not None
    hidden = teacher_forced_blocks(drafter, target.model.embed_tokens, feats, tokens, anchors)
    logits = drafter.logits(hidden[0], target.lm_head)  # [A, B, V']
    wanted = anchors[0].unsqueeze(1) + torch.arange(1, block + 1)  # [A, B]
    candidates = Candidates.top_k(logits, top_k, drafter.vocab_ids)  # [A, B, K] each
    walks = {}
    if rules:
        assert drafter.corrector is not None
        scores = drafter.corrector(
            hidden[0], candidates.ids, candidates.logits, target.model.embed_tokens.weight
        )  # [A, B-1, K, K]
        walks = {r.value: select(r, scores, candidates, gamma).tokens for r in rules}  # [A, B]
    return Blocks(
        tokens=tokens,
        anchors=anchors[0],
        labels=tokens[0, wanted.clamp(max=length - 1)],
        valid=wanted < length,
        candidates=candidates,
        walks=walks,
    )


def check_rules(drafter: DFlashDrafter, rules: tuple[Rule, ...]) -> None:
    if rules and drafter.corrector is None:
        raise ValueError("walk rules need a drafter with a corrector")


@torch.no_grad()
def measure_coverage(
    target: CausalLM,
    drafter: DFlashDrafter,
    sequences: list[tuple[list[int], list[int]]],
    top_k: int,
    rules: tuple[Rule, ...] = (),
    gamma: float = 0.5,
) -> Coverage:
    """sequences: (prompt ids, greedy completion ids) pairs; `rules`: the walks to measure
    over the corrector's scores (a drafter with a corrector; gamma: the discounted rule's).
    Casts the drafter to the target's activation dtype, in place (an engine may have left the
    target in another precision)."""
    check_rules(drafter, rules)
    drafter.cast(target.model.embed_tokens.weight.dtype)
    result = Coverage.empty(drafter.config.block_size, top_k)
    for prompt, completion in sequences:
        if len(completion) < 2:
            continue
        b = draft_blocks(target, drafter, prompt, completion, top_k, rules, gamma)
        hits = b.candidates.ids == b.labels.unsqueeze(-1)  # [A, B, K]
        walks = {rule: chosen == b.labels for rule, chosen in b.walks.items()}  # [A, B] each
        result.add(hits[..., 0], hits.any(-1), b.valid, walks)
    return result
