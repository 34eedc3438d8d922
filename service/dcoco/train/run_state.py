"""The long run's state: a local checkpoint every few minutes, and a committed summary per leg.

- `<work>/state.pt` holds everything to resume exactly within a machine's life: the DFlash
  drafter's weights and their running average, the optimizer, the step, the random generator
  and the data position. It is replaced atomically.
- `<models>/run.json`, committed with the exported drafters after each leg, holds the step, the
  data position and every leg's figures. A new machine resumes from it and from the exported
  DFlash drafter (the averaged weights): the optimizer's moments start afresh, under a new
  warm-up; nothing else is lost.

Both carry a fingerprint of the run's settings; a state that does not match, or cannot be read,
stops the run with one line naming the file, never a silent restart from scratch.
"""

import hashlib
import json
from pathlib import Path
from pickle import UnpicklingError
from typing import Any

import torch

from dcoco.checkpoint import CheckpointError
from dcoco.train.run_config import RunConfig
from dcoco.train.run_data import Position

STATE_FILE = "state.pt"
SUMMARY_FILE = "run.json"


def fingerprint(cfg: RunConfig) -> str:
    text = json.dumps(cfg.identity(), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def save_state(work: Path, state: dict[str, Any]) -> None:
    path = work / STATE_FILE
    partial = path.with_suffix(".partial")
    torch.save(state, partial)
    partial.replace(path)


def load_state(work: Path, cfg: RunConfig) -> dict[str, Any] | None:
    """The local checkpoint, or None when there is none."""
    path = work / STATE_FILE
    if not path.exists():
        return None
    try:
        state = torch.load(path, weights_only=True)
        print_ = state["fingerprint"]
    except (
        OSError,
        RuntimeError,
        EOFError,
        KeyError,
        TypeError,
        ValueError,
        UnpicklingError,
    ) as bad:
        raise CheckpointError(
            f"{path}: cannot be read ({type(bad).__name__}); move it away to resume from the "
            f"committed {SUMMARY_FILE}"
        ) from None
    _check(path, print_, cfg)
    return dict(state)


def read_summary(models: Path, cfg: RunConfig) -> dict[str, Any] | None:
    """The committed summary of the legs so far, or None before the first leg."""
    path = models / SUMMARY_FILE
    if not path.exists():
        return None
    try:
        summary = json.loads(path.read_text())
        print_ = summary["fingerprint"]
        Position(**summary["position"])
        int(summary["step"])
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as bad:
        raise CheckpointError(f"{path}: not a run summary ({type(bad).__name__}: {bad})") from None
    _check(path, print_, cfg)
    return dict(summary)


def write_summary(models: Path, summary: dict[str, Any]) -> None:
    (models / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")


def _check(path: Path, found: object, cfg: RunConfig) -> None:
    if found != fingerprint(cfg):
        raise CheckpointError(
            f"{path}: made with other run settings (fingerprint {found}, these settings "
            f"{fingerprint(cfg)}); resume with the settings it was made with, or move it away"
        )
