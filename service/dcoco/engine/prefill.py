"""How many prompt tokens a step may prefill while other sequences are decoding.

A chunk delays every running stream by what it adds to their step. Where the streams take a
plain step, the chunk runs in the same forward (`ModelRunner.decode_with_chunks`): each weight
is read once for both, and the chunk adds only its tokens' work. After a verifying cycle it runs
in a forward of its own and adds its whole time, a fixed part (every weight read once, however
few its tokens) plus a part per token: on the AMX Xeon, int4, 16 tokens took 35 ms and 128
tokens 63 ms beside a 22 ms cycle of 8 streams. So neither a token count nor a rate per token
fits every CPU, precision and batch, and the budget is steered instead: it starts at
FIRST_CHUNK, and after each chunk scales by how far what it added was from `cycles` decoding
cycles (at most doubling or halving), so the streams' gap between tokens stays within about 1 +
`cycles` of its usual. `cap` (DCOCO_PREFILL_TOKENS) bounds it; with `cycles` 0
(DCOCO_PREFILL_CYCLES) every step takes `cap` tokens, whatever they cost. Where the fixed part
alone exceeds `cycles`, the chunks stay at MIN_CHUNK: the prompt still advances, slowly.

A decoding cycle's time is the median of the last CYCLE_WINDOW plain cycles: a running mean
started from the first cycle kept an engine's slow first steps for dozens of cycles, and a
shared machine's stalls pull any mean up, either of which let chunks run over their target.
"""

import statistics
from collections import deque
from dataclasses import dataclass, field

FIRST_CHUNK = 16  # the budget before any chunk was measured
MIN_CHUNK = 4  # prompt tokens a prefilling sequence gets per step at least
UNBOUNDED = 2**62  # a sequence's share of a step that prefills whole prompts
RATE = 0.2  # weight of each new measurement in a running mean
CYCLE_WINDOW = 16  # plain cycles whose median is a decoding cycle's time
EXPLORE_EVERY = 8  # chunks: one in this many runs the way `ChunkPlacement` did not choose
GROUP_TOKENS = 8_192  # padded tokens a forward of whole prompts holds at most (one prompt more)
MAX_PADDING = 0.125  # of a forward's padded tokens, where whole prompts share it
# Padding a forward of whole prompts may always hold: a few dozen tokens cost about what a
# forward of their own would in fixed work (every weight read, every layer's overhead).
MIN_PADDING = 32


@dataclass
class PrefillBudget:
    cap: int
    cycles: float = 2.0  # a chunk's time, in decoding cycles, that the budget steers to
    chunk: int = FIRST_CHUNK  # the steered budget
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=CYCLE_WINDOW))

    @property
    def per_cycle(self) -> float:
        """Seconds a decoding cycle takes, 0 before any was measured."""
        return statistics.median(self.recent) if self.recent else 0.0

    def tokens(self) -> int:
        """Prompt tokens for the next step's chunk, shared by the prompts being prefilled."""
        return min(self.cap, self.chunk) if self.cycles else self.cap

    def observe_chunk(self, tokens: int, seconds: float, allowed: int) -> None:
        """A step's chunk of `tokens` prompt tokens (of `allowed`), taken while streams
        decode, added `seconds` to their step. A chunk short of what it was allowed (a
        prompt's last) that stayed within the target says nothing of what a full one would
        cost: it changes nothing."""
        target = self.cycles * self.per_cycle
        if not target or (tokens < allowed and seconds <= target):
            return
        scale = min(2.0, max(0.5, target / seconds)) if seconds > 0 else 2.0
        self.chunk = max(MIN_CHUNK, min(self.cap, int(max(tokens, MIN_CHUNK) * scale)))

    def observe_cycle(self, seconds: float) -> None:
        self.recent.append(seconds)


@dataclass
class ChunkPlacement:
    """Where a chunk runs when the streams take a plain step: in their forward, reading each
    weight once for both, or in a forward of its own. Which adds less to the streams' step
    depends on the CPU: where a wide forward costs about what a narrow one does (AMX), riding
    along saves the chunk's own weight reads; where cost grows with rows, the chunk's forces
    the streams' rows off their narrow kernels (the quantized linears switch to dense weights
    at the width the two make together) and off their compiled graphs, and its own forward
    costs no more. So it is measured: each way's seconds added per chunk token (a running
    mean), the cheaper way taken, and every EXPLORE_EVERY-th chunk the other (`choose`).
    `forced` fixes the way instead (`EngineConfig.prefill_alongside`)."""

    forced: bool | None = None
    added: dict[bool, float] = field(default_factory=dict)  # alongside -> seconds per token
    chunks: int = 0

    def alongside(self) -> bool:
        if self.forced is not None:
            return self.forced
        self.chunks += 1
        untried = [way for way in (True, False) if way not in self.added]
        if untried:
            return untried[0]
        cheaper = self.added[True] <= self.added[False]
        return not cheaper if self.chunks % EXPLORE_EVERY == 0 else cheaper

    def choose(self, floor: float) -> tuple[bool, float]:
        """The next chunk's way and its `part` of the budget. `floor`: the least part that
        still gives each prompt MIN_CHUNK tokens. A dearer way whose part falls below it is
        not explored this time: its chunk, held at MIN_CHUNK, would add more to the streams'
        step than the budget's chunk does the cheaper way, and a ride along in an engine whose
        plain steps are compiled also runs the streams' rows eagerly."""
        alongside = self.alongside()
        part = self.part(alongside)
        return (not alongside, 1.0) if part < floor else (alongside, part)

    def part(self, alongside: bool) -> float:
        """The share of the budget a chunk run this way gets: all of it where this way is the
        cheaper (or either is unmeasured); where it is only explored, what the cheaper way
        would take in the same time, so that exploring costs the streams no more than the
        budget's chunk does."""
        mine, other = self.added.get(alongside), self.added.get(not alongside)
        if mine is None or other is None or mine <= other:
            return 1.0
        return other / mine

    def observe(self, alongside: bool, tokens: int, seconds: float) -> None:
        """A chunk of `tokens` run that way added `seconds` to the streams' step."""
        per_token = max(seconds, 0.0) / max(tokens, 1)
        mean = self.added.get(alongside)
        self.added[alongside] = per_token if mean is None else mean * (1 - RATE) + per_token * RATE


def length_groups(widths: list[int]) -> list[list[int]]:
    """Rows of prompts prefilled whole (`widths` tokens each) in forwards of their own, each
    padded to its longest: longest first, the next shorter joining the current forward while
    it stays within GROUP_TOKENS padded tokens and MAX_PADDING of them padding (or
    MIN_PADDING tokens, where that is more). All in one
    forward, short prompts were padded to the longest: the long run's distiller refills a
    hundred rows at once, with prompts of 20 to 512 tokens."""
    groups: list[list[int]] = []
    for row in sorted(range(len(widths)), key=lambda r: -widths[r]):
        group = groups[-1] if groups else []
        padded = widths[group[0]] * (len(group) + 1) if group else 0
        real = sum(widths[r] for r in group) + widths[row]
        allowed = max(MAX_PADDING * padded, MIN_PADDING)
        if group and padded <= GROUP_TOKENS and padded - real <= allowed:
            group.append(row)
        else:
            groups.append([row])
    return groups
