"""How many prompt tokens a step may prefill while other sequences are decoding.

A step runs the prompts' chunk, then the running streams' cycle, so a chunk delays every stream
by its own time. A chunk's time is a fixed part (every weight is read once, however few its
tokens) plus a part per token: on the AMX Xeon, int4, 16 tokens took 35 ms and 128 tokens
63 ms beside a 22 ms cycle of 8 streams. So neither a token count nor a rate per token fits
every CPU, precision and batch, and the budget is steered instead: it starts at MIN_CHUNK, and
after each chunk scales by how far that chunk's time was from `cycles` decoding cycles (at most
doubling or halving), so the streams' gap between tokens stays within about 1 + `cycles` of
its usual. `cap` (DCOCO_PREFILL_TOKENS) bounds it; with `cycles` 0 (DCOCO_PREFILL_CYCLES) every
step takes `cap` tokens, whatever they cost. Where the fixed part alone exceeds `cycles`, the
chunks stay at MIN_CHUNK: the prompt still advances, slowly.
"""

from dataclasses import dataclass

MIN_CHUNK = 16  # prompt tokens a prefilling sequence gets per step at least
UNBOUNDED = 2**62  # a sequence's share of a step that prefills whole prompts
RATE = 0.2  # weight of each new cycle's time in the running mean


@dataclass
class PrefillBudget:
    cap: int
    cycles: float = 2.0  # a chunk's time, in decoding cycles, that the budget steers to
    chunk: int = MIN_CHUNK  # the steered budget
    per_cycle: float = 0.0  # seconds a decoding cycle, a running mean

    def tokens(self) -> int:
        """Prompt tokens for the next step's chunk, shared by the prompts being prefilled."""
        return min(self.cap, self.chunk) if self.cycles else self.cap

    def observe_chunk(self, tokens: int, seconds: float, allowed: int) -> None:
        """A step's chunk of `tokens` prompt tokens (of `allowed`), taken while streams
        decode, took `seconds`. A chunk short of what it was allowed (a prompt's last) that
        stayed within the target says nothing of what a full one would cost: it changes
        nothing."""
        target = self.cycles * self.per_cycle
        if not target or seconds <= 0 or (tokens < allowed and seconds <= target):
            return
        scale = min(2.0, max(0.5, target / seconds))
        self.chunk = max(MIN_CHUNK, min(self.cap, int(max(tokens, MIN_CHUNK) * scale)))

    def observe_cycle(self, seconds: float) -> None:
        self.per_cycle = (
            seconds if not self.per_cycle else (self.per_cycle * (1 - RATE) + seconds * RATE)
        )
