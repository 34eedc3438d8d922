"""Speculation statistics as plain data; exporters (Prometheus, JSON) read these."""

from dataclasses import dataclass, field

PHASES = ("draft", "correct", "verify", "total")


@dataclass
class SpecStats:
    """Counters over a set of verifications: one cycle of a batch, or one request's lifetime.

    Each sequence verified in a cycle is one verification; `seconds` is the wall time of the
    cycles involved, per phase (a request is charged the whole time of every cycle it was in).
    """

    verifications: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0  # accepted drafted tokens, the bonus not counted
    accepted_per_position: list[int] = field(default_factory=list)  # [B] accepted at each slot
    corrected_tokens: int = 0  # drafted tokens whose candidate was not the top-1
    corrected_accepted_tokens: int = 0  # of those, accepted
    lookup_draft_tokens: int = 0  # drafted tokens that came from prompt lookup, not a drafter
    lookup_accepted_tokens: int = 0  # of those, accepted
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))

    @property
    def rejected_tokens(self) -> int:
        return self.draft_tokens - self.accepted_tokens

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per verification, bonus included (1..B+1)."""
        return 1.0 + self.accepted_tokens / self.verifications if self.verifications else 0.0

    def add(self, other: "SpecStats") -> None:
        self.verifications += other.verifications
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens
        width = max(len(self.accepted_per_position), len(other.accepted_per_position))
        mine = self.accepted_per_position + [0] * (width - len(self.accepted_per_position))
        theirs = other.accepted_per_position + [0] * (width - len(other.accepted_per_position))
        self.accepted_per_position = [a + b for a, b in zip(mine, theirs, strict=True)]
        self.corrected_tokens += other.corrected_tokens
        self.corrected_accepted_tokens += other.corrected_accepted_tokens
        self.lookup_draft_tokens += other.lookup_draft_tokens
        self.lookup_accepted_tokens += other.lookup_accepted_tokens
        for phase, value in other.seconds.items():
            self.seconds[phase] = self.seconds.get(phase, 0.0) + value

    def to_dict(self) -> dict[str, object]:
        return {
            "verifications": self.verifications,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "mean_accepted_length": round(self.mean_accepted_length, 4),
            "accepted_per_position": self.accepted_per_position,
            "corrected_tokens": self.corrected_tokens,
            "corrected_accepted_tokens": self.corrected_accepted_tokens,
            "lookup_draft_tokens": self.lookup_draft_tokens,
            "lookup_accepted_tokens": self.lookup_accepted_tokens,
            "seconds": {k: round(v, 6) for k, v in self.seconds.items()},
        }


@dataclass
class CycleStats(SpecStats):
    accepted_lengths: list[int] = field(default_factory=list)  # per verification, bonus included
    method: str = ""  # the speculation of the sequences counted ("off", "ngram", "dflash", "dcoco")
