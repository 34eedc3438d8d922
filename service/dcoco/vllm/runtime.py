"""DCOCO inside vLLM's worker: the draft selection and its bookkeeping, in plain torch.

Terms, as in `dcoco.shared.stats`:
- draft: the B tokens proposed for one request in one cycle;
- candidate: one of the K best drafter tokens at a slot (index 0 is the drafter's top-1);
- corrected: a drafted token whose candidate index is not 0 (the walk overrode the top-1);
- accepted: a drafted token the target verified; a corrected one that was accepted is what the
  corrector rescued.

vLLM's scheduler counts drafts and acceptances; only the worker sees which drafted tokens were
corrected, so this module pairs each request's correction mask from one step with the number of
tokens the next step accepted for it. Nothing here imports vLLM.
"""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from dcoco.shared.options import Rule
from dcoco.spec.corrector import Corrector
from dcoco.spec.select import Candidates, Selection, select


class CycleSink(Protocol):
    """Where the per-cycle figures go (Prometheus in the worker process; a list in tests)."""

    def record(self, corrected: int, rescued: int, seconds: dict[str, float]) -> None: ...


@dataclass(frozen=True)
class SelectionConfig:
    """How drafts are picked; read from the checkpoint, since vLLM's speculative config takes
    no extra fields."""

    top_k: int  # K
    rule: Rule = Rule.PREFIX
    gamma: float = 0.5  # the discounted rule's decay per slot

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> "SelectionConfig":
        corrector = raw.get("dcoco_config") or {}
        chosen = raw.get("dcoco_selection") or {}
        try:
            cfg = cls(
                top_k=int(chosen.get("top_k", corrector["top_k"])),
                rule=Rule(chosen.get("rule", Rule.PREFIX)),
                gamma=float(chosen.get("gamma", 0.5)),
            )
        except KeyError:
            raise ValueError("a DCOCO drafter needs dcoco_config.top_k") from None
        except (TypeError, ValueError) as bad:
            raise ValueError(f"bad dcoco_selection: {bad}") from None
        if cfg.top_k < 1 or not 0.0 < cfg.gamma <= 1.0:
            raise ValueError("dcoco_selection needs top_k >= 1 and gamma in (0, 1]")
        return cfg


@dataclass
class StepTimes:
    """Wall time of the current engine step, split by the hooks that see each part."""

    started: float = 0.0
    draft: float = 0.0  # the drafter's forward (its whole propose minus the correction)
    correct: float = 0.0  # top-K, corrector scores and the walk


@dataclass
class DCOCORuntime:
    corrector: Corrector
    selection: SelectionConfig
    sink: CycleSink | None = None
    draft_log: Path | None = None  # debugging and tests: one JSON line per drafting call
    times: StepTimes = field(default_factory=StepTimes)
    latest: torch.Tensor | None = None  # [R, B] corrected mask of the last draft, batch order
    pending: dict[str, list[bool]] = field(default_factory=dict)  # request -> corrected mask

    @torch.inference_mode()
    def draft(
        self,
        hidden: torch.Tensor,
        logits: torch.Tensor,
        embed_weight: torch.Tensor,
        vocab_ids: torch.Tensor | None = None,
    ) -> Selection:
        """Slot states [R, B, H] and drafter logits [R, B, V'] -> the selected draft.
        `vocab_ids` [V'] names each logit column's token for a reduced drafting vocabulary.

        Slot 0 keeps the drafter's top-1 under every rule but global, which may pick another
        start; prefix-first is the default."""
        start = time.perf_counter()
        cands = Candidates.top_k(logits, self.selection.top_k, vocab_ids)  # [R, B, K] each
        scores = self.corrector(hidden, cands.ids, cands.logits, embed_weight)  # [R, B-1, K, K]
        chosen = select(self.selection.rule, scores, cands, self.selection.gamma)
        self.latest = (chosen.index != 0).cpu()  # [R, B]
        self.times.correct += time.perf_counter() - start
        if self.draft_log is not None:
            self._log(hidden, chosen)
        return chosen

    def transition_scores(
        self,
        hidden: torch.Tensor,
        cand_ids: torch.Tensor,
        cand_logits: torch.Tensor,
        embed_weight: torch.Tensor,
    ) -> torch.Tensor:
        """The V2 walk's input [R, B, K, K]: row (p, a) scores slot p's candidates after
        candidate a at slot p-1.

        Slot 0 has no predecessor; its rows all hold the drafter's own logits, and the walk
        starts at row 0, so a greedy walk keeps slot 0's top-1. Static shapes, no host syncs:
        this runs inside a CUDA graph. hidden [R, B, H], cand_ids and cand_logits [R, B, K].
        """
        r, _, k = cand_ids.shape
        pairs = self.corrector(hidden, cand_ids, cand_logits, embed_weight)  # [R, B-1, K, K]
        first = cand_logits[:, :1].unsqueeze(2).expand(r, 1, k, k)  # [R, 1, K, K]
        return torch.cat([first.to(pairs.dtype), pairs], dim=1)  # [R, B, K, K]

    def settle(
        self,
        req_ids: list[str],
        sampled: list[list[int]],
        num_draft_tokens: list[int] | None,
        now: float,
    ) -> None:
        """After a step's verification: count what the corrector changed and rescued in the
        drafts this step verified, record the step's phase times, and remember the masks of
        the drafts it just proposed (in `latest`, batch order `req_ids`)."""
        corrected = rescued = 0
        verified = False
        for row, req_id in enumerate(req_ids):
            mask = self.pending.get(req_id)
            if mask is None or num_draft_tokens is None or row >= len(sampled):
                continue
            drafted = num_draft_tokens[row] if row < len(num_draft_tokens) else 0
            if drafted == 0:
                continue
            verified = True
            accepted = max(len(sampled[row]) - 1, 0)  # the bonus token is not a draft
            corrected += sum(mask[:drafted])
            rescued += sum(mask[: min(accepted, drafted)])
        if verified and self.sink is not None:
            total = now - self.times.started
            verify = max(total - self.times.draft - self.times.correct, 0.0)
            seconds = {
                "draft": self.times.draft,
                "correct": self.times.correct,
                "verify": verify,
                "total": total,
            }
            self.sink.record(corrected, rescued, seconds)
        masks = self.latest.tolist() if self.latest is not None else []
        self.pending = dict(zip(req_ids, masks, strict=False))
        self.latest = None

    def start_step(self, now: float) -> None:
        self.times = StepTimes(started=now)

    def _log(self, hidden: torch.Tensor, chosen: Selection) -> None:
        assert self.draft_log is not None
        line = {"hidden": hidden.float().tolist(), "tokens": chosen.tokens.tolist()}
        with self.draft_log.open("a") as out:
            out.write(json.dumps(line) + "\n")
