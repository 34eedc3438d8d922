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


@dataclass
class StepResult:
    outputs: list[RequestOutput] = field(default_factory=list)
    cycle: CycleStats | None = None


@dataclass(frozen=True)
class Completion:
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    finish_reason: str
    stats: SpecStats
