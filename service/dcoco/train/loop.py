"""The training loop every stage shares: a wall-clock budget, a learning-rate schedule tied
to it, and a progress bar."""

import math
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

MIN_LR_FRACTION = 0.1  # cosine decay ends at 10% of the peak, the usual choice
EMA = 0.98  # reported losses average over the last ~50 steps
# Under bf16 autocast, RMSNorm's fp32 weight meets bf16 activations; torch warns once per norm.
warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")


@dataclass
class Budget:
    """Progress is max(steps / max_steps, seconds / budget_s); the stage ends at 1."""

    budget_s: float
    max_steps: int
    warmup_steps: int
    started: float = field(default_factory=time.perf_counter)
    steps: int = 0

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    @property
    def progress(self) -> float:
        return min(1.0, max(self.steps / self.max_steps, self.elapsed / self.budget_s))

    def lr_scale(self) -> float:
        """Linear warm-up over steps, then cosine decay over progress."""
        warm = min(1.0, (self.steps + 1) / max(1, self.warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * self.progress))
        return warm * (MIN_LR_FRACTION + (1.0 - MIN_LR_FRACTION) * cosine)


@dataclass(frozen=True)
class LoopResult:
    steps: int
    seconds: float
    metrics: dict[str, float]  # exponential moving averages at the end


def train_loop(
    name: str,
    budget: Budget,
    optimizer: torch.optim.Optimizer,
    step: Callable[[], dict[str, torch.Tensor]],
    clip: float = 1.0,
) -> LoopResult:
    """Runs `step` (forward and backward, returning named losses; the first is reported) until
    the budget is spent, clipping gradients and stepping the optimizer after each."""
    peaks = [group["lr"] for group in optimizer.param_groups]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    sums: dict[str, float] = {}
    averages: dict[str, float] = {}
    with tqdm(
        total=100, desc=name, unit="%", bar_format="{l_bar}{bar}| {elapsed} {postfix}"
    ) as bar:
        while budget.progress < 1.0:
            scale = budget.lr_scale()
            for group, peak in zip(optimizer.param_groups, peaks, strict=True):
                group["lr"] = peak * scale
            optimizer.zero_grad(set_to_none=True)
            losses = step()
            torch.nn.utils.clip_grad_norm_(params, clip)
            optimizer.step()
            budget.steps += 1
            for key, value in losses.items():  # bias-corrected moving averages, as in Adam
                sums[key] = EMA * sums.get(key, 0.0) + (1.0 - EMA) * float(value)
                averages[key] = sums[key] / (1.0 - EMA**budget.steps)
            if budget.steps % 10 == 0 or budget.progress >= 1.0:
                bar.update(round(100 * budget.progress) - bar.n)
                bar.set_postfix(
                    {k: f"{v:.3f}" for k, v in averages.items()} | {"step": budget.steps}
                )
    for group, peak in zip(optimizer.param_groups, peaks, strict=True):
        group["lr"] = peak
    return LoopResult(budget.steps, budget.elapsed, averages)
