"""What the engine hands back: per step, each request's new tokens; per run, completions."""

from dataclasses import dataclass, field

import torch

from dcoco.shared.stats import CycleStats, SpecStats


@dataclass(frozen=True)
class RequestOutput:
    request_id: str
    new_token_ids: list[int]  # committed this step
    finished: bool
    finish_reason: str | None
    stats: SpecStats  # the request's speculation so far (a shallow copy)
    # With cfg.feature_layers: [T, F] target features of the positions this step processed.
    features: torch.Tensor | None = None
    # Where each new token came from ("drafted", "corrected", "target": `accounting`), and
    # what this step's draft held past its accepted prefix.
    provenance: tuple[str, ...] = ()
    rejected: tuple[int, ...] = ()
    cycle: int = 0  # the request's verification cycles so far, this step's included


@dataclass
class StepResult:
    outputs: list[RequestOutput] = field(default_factory=list)
    cycles: list[CycleStats] = field(default_factory=list)  # one per speculation method


@dataclass(frozen=True)
class Completion:
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    stats: SpecStats
