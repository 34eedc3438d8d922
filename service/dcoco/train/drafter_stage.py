"""Stages 5-7: the DFlash drafter, then DCOCO jointly from it, and DCOCO with it frozen.

All three are teacher-forced: the target's features at every position (kept from generation,
or one frozen target pass), and `teacher_forced_blocks` drafts many blocks per sequence in one
drafter pass, exactly as the engine's cached path would (a test proves the two equal).
"""

from dataclasses import dataclass, replace
from enum import StrEnum

import torch
from torch import nn

from dcoco.model.causal_lm import CausalLM
from dcoco.spec.corrector import CorrectorConfig
from dcoco.spec.drafter import DFlashDrafter, DrafterConfig, teacher_forced_blocks
from dcoco.train.config import CorrectorTrainConfig, DrafterTrainConfig
from dcoco.train.data import Continuations
from dcoco.train.loop import Budget, LoopResult, train_loop
from dcoco.train.losses import (
    block_cross_entropy,
    correction_loss,
    corrector_scores,
    pair_targets,
)
from dcoco.train.target_stage import INIT_STD
from dcoco.train.vocab import TrainVocab


class Phase(StrEnum):
    DFLASH = "dflash"  # drafter only, block cross-entropy
    JOINT = "dcoco"  # drafter and corrector, both losses, from the DFlash checkpoint
    FROZEN = "dcoco-frozen"  # corrector only, on top of the frozen DFlash drafter


def new_drafter(
    cfg: DrafterTrainConfig, target: CausalLM, mask_token_id: int, seed: int
) -> DFlashDrafter:
    torch.manual_seed(seed)
    # The drafter is a Qwen3 stack whatever the target's family, as vLLM's DFlash drafter is.
    model = replace(
        target.config,
        num_hidden_layers=cfg.num_layers,
        tie_word_embeddings=False,
        family="qwen3",
    )
    drafter = DFlashDrafter(
        DrafterConfig(
            model=model,
            block_size=cfg.block_size,
            mask_token_id=mask_token_id,
            target_layer_ids=cfg.target_layer_ids,
            target_hidden_size=target.config.hidden_size,
        )
    )
    for name, param in drafter.named_parameters():
        if not name.endswith("norm.weight"):
            nn.init.normal_(param, 0.0, INIT_STD)
    # The mask slots start from the target's own embedding of <|mask|> and learn from there.
    drafter.mask_embedding = target.model.embed_tokens.weight[mask_token_id].detach().clone()
    return drafter


def with_corrector(drafter: DFlashDrafter, cfg: CorrectorTrainConfig, seed: int) -> DFlashDrafter:
    """A copy of `drafter` with a fresh corrector, whose zero output layer reproduces it."""
    corrector = CorrectorConfig(
        top_k=cfg.top_k, rep_dim=cfg.rep_dim, pair_dim=cfg.pair_dim, mlp_dim=cfg.mlp_dim
    )
    torch.manual_seed(seed)
    copy = DFlashDrafter(replace(drafter.config, corrector=corrector))
    copy.load_state_dict(drafter.state_dict(), strict=False)
    assert drafter.mask_embedding is not None
    copy.mask_embedding = drafter.mask_embedding.clone()
    return copy


def target_features(
    target: CausalLM, tokens: torch.Tensor, layers: tuple[int, ...]
) -> torch.Tensor:
    """The frozen target's features at every position of tokens [N, T]: [N, T, F]."""
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        positions = torch.arange(tokens.shape[1]).expand_as(tokens)  # [N, T]
        _, feats = target(tokens, positions, feature_layers=layers)  # [N, T, F]
    assert feats is not None
    return feats.float()


@dataclass(frozen=True)
class PhaseSettings:
    budget_s: float
    max_steps: int
    warmup_steps: int
    batch_size: int  # sequences per step
    anchors: int  # blocks per sequence


def phase_settings(
    phase: Phase, dcfg: DrafterTrainConfig, ccfg: CorrectorTrainConfig
) -> PhaseSettings:
    if phase is Phase.DFLASH:
        return PhaseSettings(
            dcfg.budget_s, dcfg.max_steps, dcfg.warmup_steps, dcfg.batch_size, dcfg.anchors
        )
    budget = ccfg.joint_budget_s if phase is Phase.JOINT else ccfg.frozen_budget_s
    return PhaseSettings(budget, ccfg.max_steps, ccfg.warmup_steps, ccfg.batch_size, ccfg.anchors)


def phase_optimizer(
    phase: Phase,
    drafter: DFlashDrafter,
    mask: nn.Parameter,
    dcfg: DrafterTrainConfig,
    ccfg: CorrectorTrainConfig,
) -> torch.optim.Optimizer:
    """DFlash trains the drafter body and mask vector; joint adds the corrector at its own
    rate; frozen trains the corrector alone. A drafter's own reduced LM head holds the
    target's rows and stays frozen, as the target's head does."""
    body = [
        p for n, p in drafter.named_parameters() if not n.startswith(("corrector.", "lm_head."))
    ] + [mask]
    groups: list[dict[str, object]] = []
    if phase is not Phase.FROZEN:
        groups.append({"params": body, "lr": dcfg.lr if phase is Phase.DFLASH else ccfg.drafter_lr})
    if drafter.corrector is not None:
        groups.append({"params": list(drafter.corrector.parameters()), "lr": ccfg.corrector_lr})
    return torch.optim.AdamW(groups, weight_decay=0.0)


@dataclass
class PhaseStep:
    """One training step's forward and backward for a phase, on batches drawn from `data`.

    `mask` is the trainable mask-slot vector; the drafter reads it afresh every step.
    """

    phase: Phase
    drafter: DFlashDrafter
    mask: nn.Parameter
    target: CausalLM
    vocab: TrainVocab
    settings: PhaseSettings
    dcfg: DrafterTrainConfig
    ccfg: CorrectorTrainConfig
    generator: torch.Generator

    def __call__(self, data: Continuations) -> dict[str, torch.Tensor]:
        drafter, settings, corrector = self.drafter, self.settings, self.drafter.corrector
        block, embed = drafter.config.block_size, self.target.model.embed_tokens
        layers = drafter.config.target_layer_ids
        if data.features is not None and data.feature_layers != layers:
            raise ValueError(
                f"the data keeps layers {data.feature_layers}, the drafter reads {layers}"
            )
        rows = torch.randint(0, len(data), (settings.batch_size,), generator=self.generator)  # [N]
        tokens, starts, labels = data.batch(rows, settings.anchors, block, self.generator)
        if data.features is None:
            feats = target_features(self.target, tokens, layers)  # [N, T, F]
        else:
            feats = data.batch_features(rows, tokens.shape[1]).float()  # [N, T, F]
        drafter.mask_embedding = self.mask.view(-1)  # [H], re-read after every optimizer step
        with (
            torch.set_grad_enabled(self.phase is not Phase.FROZEN),
            torch.autocast("cpu", dtype=torch.bfloat16),
        ):
            hidden = teacher_forced_blocks(drafter, embed, feats, tokens, starts)  # [N, A, B, H]
            logits = self.vocab.logits(hidden, self.target.lm_head.weight)  # [N, A, B, Vs]
        block_loss = block_cross_entropy(logits, self.vocab.labels(labels), self.dcfg.depth_decay)
        losses = {"block": block_loss}
        if corrector is not None:
            ids, scores = corrector_scores(
                corrector,
                hidden.float().flatten(0, 1),
                logits.float().flatten(0, 1),
                embed.weight,
                self.vocab.ids,
            )  # [R, B, K], [R, B-1, K, K] with R = N*A
            targets = pair_targets(ids, labels.flatten(0, 1))  # labels [R, B]
            losses["correct"] = correction_loss(scores, targets, self.ccfg.correction_decay)
        if self.phase is Phase.DFLASH:
            total = losses["block"]
        elif self.phase is Phase.JOINT:
            total = losses["block"] + self.ccfg.correction_weight * losses["correct"]
        else:
            total = losses["correct"]
        total.backward()
        return {"loss": total.detach()} | {k: v.detach() for k, v in losses.items()}


def phase_step(
    phase: Phase,
    drafter: DFlashDrafter,
    target: CausalLM,
    vocab: TrainVocab,
    dcfg: DrafterTrainConfig,
    ccfg: CorrectorTrainConfig,
    seed: int,
) -> tuple[PhaseStep, torch.optim.Optimizer]:
    """The step and optimizer of one phase, the drafter put in training mode."""
    target.requires_grad_(False)
    assert drafter.mask_embedding is not None
    mask = nn.Parameter(drafter.mask_embedding.clone())
    settings = phase_settings(phase, dcfg, ccfg)
    optimizer = phase_optimizer(phase, drafter, mask, dcfg, ccfg)
    generator = torch.Generator().manual_seed(seed)
    drafter.train()
    step = PhaseStep(phase, drafter, mask, target, vocab, settings, dcfg, ccfg, generator)
    return step, optimizer


def train_drafter(
    phase: Phase,
    drafter: DFlashDrafter,
    target: CausalLM,
    data: Continuations,
    vocab: TrainVocab,
    dcfg: DrafterTrainConfig,
    ccfg: CorrectorTrainConfig,
    seed: int,
) -> tuple[DFlashDrafter, LoopResult]:
    """Trains `drafter` in place for one phase; returns it in eval mode with the loop's record.
    `vocab` is the drafting vocabulary, the same for every phase."""
    step, optimizer = phase_step(phase, drafter, target, vocab, dcfg, ccfg, seed)
    settings = step.settings
    budget = Budget(settings.budget_s, settings.max_steps, settings.warmup_steps)
    result = train_loop(phase.value, budget, optimizer, lambda: step(data))
    drafter.mask_embedding = step.mask.detach().clone()
    return drafter.eval(), result
