"""The end of a leg of the long run: both correctors refitted on the kept shards, and the
drafters in the shipped form (bf16 weights, fp32 mask vector)."""

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from dcoco.checkpoint import load_drafter, save_drafter
from dcoco.model.causal_lm import CausalLM
from dcoco.paths import REPO_ROOT
from dcoco.spec.drafter import DFlashDrafter
from dcoco.tokenizer import END_OF_TEXT, Tokenizer
from dcoco.train.data import Continuations
from dcoco.train.drafter_stage import Phase, train_drafter
from dcoco.train.run_config import RunConfig
from dcoco.train.run_data import Position, concat, for_corrector, shard_file
from dcoco.train.vocab import TrainVocab

CORRECTOR_SHARDS = 8  # the newest kept shards the correctors train on


def drafting_vocab(drafter: DFlashDrafter) -> TrainVocab:
    """The tokens the drafter drafts over: its reduced vocabulary, or the target's."""
    vocab = drafter.config.model.vocab_size
    ids = drafter.vocab_ids
    return TrainVocab.full(vocab) if ids is None else TrainVocab.of_ids(ids, vocab)


def refit_correctors(
    cfg: RunConfig,
    work: Path,
    models: Path,
    dflash: DFlashDrafter,
    target: CausalLM,
    position: Position,
    deadline: float,
) -> dict[str, Any]:
    """Both correctors refitted on the kept shards over the rest of the leg's time.

    Without a kept shard on this machine (a leg too short to make one), both stay as they
    are: each shipped folder holds its own drafter weights, so an unrefitted corrector still
    matches the drafter it ships with.
    """
    kept = [s for s in range(position.shards) if for_corrector(s, cfg)]
    files = [shard_file(work, s) for s in kept if shard_file(work, s).exists()][-CORRECTOR_SHARDS:]
    if not files:
        print("[run] no kept shard on this machine: the correctors stay as they are", flush=True)
        return {"correctors": "not refitted: no kept shard yet"}
    pad = Tokenizer.from_dir(REPO_ROOT / cfg.target_path).token_id(END_OF_TEXT)
    data = replace(concat([Continuations.load(f) for f in files], pad), labels=cfg.teacher_labels)
    remaining = max(60.0, deadline - time.perf_counter())
    facts: dict[str, Any] = {"corrector_sequences": len(data)}
    vocab = drafting_vocab(dflash)
    for phase, share in ((Phase.JOINT, 0.6), (Phase.FROZEN, 0.4)):
        previous = load_drafter(models / phase.value)
        drafter = DFlashDrafter(replace(dflash.config, corrector=previous.config.corrector))
        drafter.load_state_dict(dflash.state_dict(), strict=False)
        assert drafter.corrector is not None
        assert previous.corrector is not None
        drafter.corrector.load_state_dict(previous.corrector.state_dict())
        drafter.mask_embedding = dflash.mask_embedding
        budget = remaining * share
        ccfg = replace(cfg.corrector, joint_budget_s=budget, frozen_budget_s=budget)
        drafter, result = train_drafter(
            phase, drafter, target, data, vocab, cfg.drafter, ccfg, cfg.seed + position.shards
        )
        save_drafter(shipped(drafter), models / phase.value)
        facts[phase.value] = {"steps": result.steps} | {
            k: round(v, 4) for k, v in result.metrics.items()
        }
    return facts


def shipped(drafter: DFlashDrafter) -> DFlashDrafter:
    """Weights in bf16 as the shipped folders hold them; the mask vector stays fp32."""
    mask = drafter.mask_embedding
    drafter = drafter.to(torch.bfloat16)
    drafter.mask_embedding = None if mask is None else mask.float()
    return drafter
