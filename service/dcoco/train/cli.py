"""`dcoco train`: the preset, adjusted by the command line, through the pipeline."""

import argparse
from dataclasses import replace

from dcoco.checkpoint import CheckpointError
from dcoco.shared.errors import UsageError
from dcoco.tokenizer import TokenizerError
from dcoco.train.config import PRESETS, PipelineConfig
from dcoco.train.pipeline import run_pipeline


def scaled(cfg: PipelineConfig, factor: float) -> PipelineConfig:
    """Every stage's wall-clock budget multiplied by `factor`."""
    c = cfg.corrector
    return replace(
        cfg,
        corpus=replace(cfg.corpus, budget_s=cfg.corpus.budget_s * factor),
        tokenizer=replace(cfg.tokenizer, budget_s=cfg.tokenizer.budget_s * factor),
        target=replace(cfg.target, budget_s=cfg.target.budget_s * factor),
        distill=replace(cfg.distill, budget_s=cfg.distill.budget_s * factor),
        drafter=replace(cfg.drafter, budget_s=cfg.drafter.budget_s * factor),
        corrector=replace(
            c, joint_budget_s=c.joint_budget_s * factor, frozen_budget_s=c.frozen_budget_s * factor
        ),
    )


def train(args: argparse.Namespace) -> None:
    cfg = scaled(PRESETS[args.preset], args.budget_scale)
    cfg = replace(cfg, seed=args.seed, threads=args.threads or cfg.threads)
    try:
        run_pipeline(cfg, args.work, args.out, tuple(args.rerun))
    except (CheckpointError, TokenizerError, OSError) as problem:
        raise UsageError(str(problem)) from None
