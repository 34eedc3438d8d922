"""Builds an engine from model folders: the one path the CLI, the worker and the evaluation use."""

from pathlib import Path

from dcoco.checkpoint import load_drafter, load_target
from dcoco.engine.engine import Engine
from dcoco.shared.engine_config import EngineConfig


def load_engine(target: Path, drafter: Path | None, cfg: EngineConfig) -> Engine:
    """Raises CheckpointError for a bad folder and ValueError for a mismatched pair."""
    if cfg.mode.needs_drafter and drafter is None:
        raise ValueError(f"mode {cfg.mode} needs a drafter folder")
    model = load_target(target)
    draft_model = load_drafter(drafter) if cfg.mode.needs_drafter and drafter else None
    return Engine(model, draft_model, cfg)
