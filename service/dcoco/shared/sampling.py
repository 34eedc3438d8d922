"""Per-request sampling parameters."""

from dataclasses import dataclass, field

from dcoco.shared.options import Mode


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 0.0  # 0 is greedy
    top_p: float = 1.0
    seed: int | None = None  # a seeded request replays exactly, whatever shares its batch
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    speculation: Mode | None = None  # this request's own; None: the engine's mode

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
