"""How many prompt tokens a step may prefill while other sequences are decoding.

A step runs the prompts' chunk, then the running streams' cycle, so a chunk delays every stream
by its own time. The budget is the number of prompt tokens that takes about one cycle, from this
engine's own measurements (a running mean of seconds per prefilled token and of seconds per
cycle): a joining prompt then at most doubles the streams' gap between tokens, whatever the
CPU, the precision or the batch. `cap` (DCOCO_PREFILL_TOKENS) bounds it from above.
"""

from dataclasses import dataclass

MIN_CHUNK = 16  # prompt tokens a prefilling sequence gets per step at least
RATE = 0.2  # weight of each new measurement in the running means


@dataclass
class PrefillBudget:
    cap: int
    per_token: float = 0.0  # seconds a prefilled token
    per_cycle: float = 0.0  # seconds a decoding cycle

    def tokens(self) -> int:
        """Prompt tokens for the next step's chunk, shared by the prompts being prefilled."""
        if not self.per_token or not self.per_cycle:
            return self.cap
        return max(MIN_CHUNK, min(self.cap, int(self.per_cycle / self.per_token)))

    def observe_prefill(self, tokens: int, seconds: float) -> None:
        self.per_token = _mean(self.per_token, seconds / max(1, tokens))

    def observe_cycle(self, seconds: float) -> None:
        self.per_cycle = _mean(self.per_cycle, seconds)


def _mean(current: float, value: float) -> float:
    return value if not current else current * (1 - RATE) + value * RATE
