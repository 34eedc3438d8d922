"""Adaptive verification: how many of the drafted tokens a cycle verifies.

A cycle drafts all B slots in one pass, then verifies a prefix of k of them (0 <= k <= B). A
prefix of a draft is a draft, so any k is lossless. The planner picks the k that maximises the
expected committed tokens per second of the whole batch:

    rate(k) = n * (1 + sum_{p < k} s_p) / (fixed(n) * [k > 0] + verify(n, k))

- s_p, the chance that slots 0..p are all accepted, is the product of per-slot conditional
  acceptance rates, each a running estimate over the verifications that reached that slot.
- verify(n, k): one target pass over n * (k + 1) tokens, a running mean of the measured
  seconds at each such width, interpolated between measured widths (`CostCurve`): not a line,
  since on a CPU the cost of a forward is far from linear in its width (weight-only 4-bit
  kernels make four tokens cost twice one, sixteen little more than eight), and a line through
  them overrates the plain step and underrates short verifications. fixed(n, k) = c + d * x is
  drafting and correction, fitted by least squares over x, the positions the drafter runs
  over: n * (k + 1) where it drafts only the slots the cycle verifies (the torch engine), n *
  (B + 1) where it always drafts the whole block (vLLM's, `whole_block`). k = 0 is a plain
  decoding step that skips the drafter.

On a small machine a wide batch makes verification expensive, so k shrinks as load grows. Now and
then a cycle tries another k, so that the estimates, and the cost curve, keep learning: as soon
as the seconds it loses against the best k (for the tokens it commits) are at most EXPLORE_SHARE
of the predicted time of the cycles since the last try. The tries take turns:
- deeper: every slot a row reaches at least REACH_FLOOR of the time by the current estimates (at
  least one beyond the best k). Slots rows seldom reach would get few verifications to learn
  from, so where acceptance is low a try is short and cheap, and where it is high it covers the
  whole block;
- a plain step, while speculation wins: else one slow plain step measured early (a page fault,
  another process) would make speculation look better for good.
Exploring is thus nearly free at batch 1 and rare at batch 32, and takes about that share of the
time at most. The estimates are per engine, one model.

A cycle's cost is learnt only where the cycle before was of its kind, a plain step after a
plain step, a verify after a verify (`observe`), and a try of the other kind lasts TRY_CYCLES
cycles: so each k is priced as a run of it costs, which is what the rates compare. The first
verify after plain steps costs more (the target's other compiled graphs, the drafter's cold
weights): on held-out code (int4, batch 1, AMD EPYC) a 3-token verify among plain steps took
39-41 ms and one among other verifies 33-37, enough to keep an engine stepping plain at 0.97x
plain decoding where verifying two tokens a cycle made 1.02-1.20x (docs/engine-profile.md).

Prompt lookup (`plan`): a row whose recent tokens recur earlier in its context has a second
draft that costs nothing to make, the tokens that followed them (`spec/ngram.py`). Where the
engine allows it, each cycle also weighs verifying those drafts, for the rows that have one,
with the drafter skipped, or run for the other rows only: those without one, and those whose
lookup draft is expected to commit fewer tokens than the drafter's. Their acceptance by slot
is estimated apart for each length of the matched suffix (a 4-token match holds far more
often than a 2-token one), learnt every cycle whatever was verified: a lookup draft's slot p
would have been accepted exactly when the target's committed token there equals it (for a
sampled row, with the chance the target gives that token, the chance a verification accepts
it), so comparing the draft with what the cycle committed observes it without verifying it.
"""

from dataclasses import dataclass, field
from itertools import accumulate

from dcoco.spec.ngram import MAX_N, MIN_N

DECAY = 0.98  # weight of the past per observation: estimates follow the last ~50 cycles
EXPLORE_SHARE = 0.02  # of the time, at most, lost to trying another k than the best
REACH_FLOOR = 0.05  # an exploration verifies the slots rows reach at least this often
PRIOR_TRIALS = 4.0  # each slot starts at a 50% acceptance rate worth this many verifications
TRY_CYCLES = 2  # cycles a try of the other kind lasts (plain or verifying): learnt from its second


@dataclass
class LineFit:
    """Least squares y = a + b * x with exponential forgetting."""

    weight: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, x: float, y: float) -> None:
        self.weight = DECAY * self.weight + 1.0
        self.x = DECAY * self.x + x
        self.y = DECAY * self.y + y
        self.xx = DECAY * self.xx + x * x
        self.xy = DECAY * self.xy + x * y

    def __call__(self, x: float) -> float:
        """The fitted y at x; flat, at the mean y, until the x seen differ. (Drafting, what it
        fits, is one batched pass whose cost grows far slower than its rows: a line through
        the origin made one row's drafting cost 8 times as much at 8 rows, and vLLM's planner
        stepped plain for 21 steps of a benchmark cell before it tried drafting there.)"""
        if self.weight == 0.0:
            return 0.0
        spread = self.weight * self.xx - self.x * self.x
        if spread <= 1e-9 * max(1.0, self.xx * self.weight):
            return self.y / self.weight
        slope = max(0.0, (self.weight * self.xy - self.x * self.y) / spread)
        intercept = max(0.0, (self.y - slope * self.x) / self.weight)
        return intercept + slope * x


@dataclass
class CostCurve:
    """Seconds by width: a running mean at each measured width (the last ~50 observations of
    it), linear between measured widths and along the nearest two beyond them.

    A forward over more tokens never costs less, so an estimate is capped by the cheapest
    wider width measured: one slow step (a page fault, another process) at a width the
    planner then avoids cannot keep it away for good.

    Beyond the widest width measured, each token costs at least the slope from the widest
    width to the widest at most half as wide (the narrowest, if none is), not only the slope
    between the widest two: nearby widths cost nearly the same within their noise (vLLM's
    32-row plain steps on 2 CPU cores: 32 and 35 tokens both about 88 ms), and the line
    along them priced a 512-token verification at 90 ms. It took 556 ms, and vLLM's
    planner, exploring the whole block at 32 rows on that estimate, lost a tenth of a
    benchmark cell. Over a doubling, the slope is that of the widths' own range, not of the
    first few tokens, which on a CPU cost far more each (the 4-bit kernels' rows)."""

    means: dict[int, float] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)

    @property
    def weight(self) -> int:
        return sum(self.counts.values())

    def add(self, width: int, seconds: float) -> None:
        n = self.counts.get(width, 0) + 1
        rate = max(1.0 / n, 1.0 - DECAY)
        self.means[width] = self.means.get(width, seconds) * (1 - rate) + seconds * rate
        self.counts[width] = n

    def __call__(self, width: int) -> float:
        wider = [seconds for x, seconds in self.means.items() if x > width]
        return min([self._interpolated(width), *wider])

    def _interpolated(self, width: int) -> float:
        if width in self.means:
            return self.means[width]
        xs = sorted(self.means)
        if not xs:
            return 0.0
        if len(xs) == 1:
            return self.means[xs[0]] * width / xs[0]
        below = [x for x in xs if x < width]
        above = [x for x in xs if x > width]
        if below and above:
            left, right = below[-1], above[0]
        elif above:  # narrower than every measured width
            left, right = xs[0], xs[1]
        else:  # wider
            left, right = xs[-2], xs[-1]
        slope = max(0.0, (self.means[right] - self.means[left]) / (right - left))
        if width > right:  # beyond: over a doubling at least (class docstring)
            base = max((x for x in xs if x <= right / 2), default=xs[0])
            wide = (self.means[right] - self.means[base]) / (right - base)
            return self.means[right] + max(slope, wide) * (width - right)
        return max(0.0, self.means[left] + slope * (width - left))


@dataclass
class Acceptance:
    """One draft source's acceptance by slot: decayed counts of the verifications that reached
    each slot and of those that kept it."""

    block: int  # B
    hits: list[float] = field(default_factory=list)  # per slot, decayed accepted counts
    trials: list[float] = field(default_factory=list)  # per slot, decayed verified counts

    def __post_init__(self) -> None:
        self.hits = [PRIOR_TRIALS / 2] * self.block
        self.trials = [PRIOR_TRIALS] * self.block

    def reach(self) -> list[float]:
        """[B + 1]: the estimated chance that a row's drafted slots 0..p-1 all hold, so that it
        reaches slot p (1 at p = 0); sum(reach[:k + 1]) is the tokens a k-cycle commits."""
        chances = [1.0]
        for hits, trials in zip(self.hits, self.trials, strict=True):
            chances.append(chances[-1] * hits / trials)
        return chances

    def observe(self, outcomes: list[tuple[int, int]]) -> None:
        """Per row (accepted, known): of the first `known` slots, whose outcome is known, the
        first `accepted` held (a verification of k knows k; a comparison with what a cycle
        committed knows no further than that)."""
        for p in range(max((known for _, known in outcomes), default=0)):
            reached = sum(1 for held, known in outcomes if known > p and held >= p)
            kept = sum(1 for held, known in outcomes if known > p and held > p)
            self.trials[p] = DECAY * self.trials[p] + reached
            self.hits[p] = DECAY * self.hits[p] + kept


@dataclass(frozen=True)
class Plan:
    """A cycle: verify k drafted tokens a row; the rows in `looked_up` verify their prompt
    lookup's draft, the others the drafter's if `drafting`, else nothing (a plain step)."""

    k: int
    looked_up: frozenset[int] = frozenset()
    drafting: bool = True


@dataclass
class VerifyPlanner:
    block: int  # B
    drafted: Acceptance = field(init=False)  # the drafter's drafts
    looked_up: dict[int, Acceptance] = field(init=False)  # lookup drafts by match length n
    whole_block: bool = False  # the drafter drafts all B slots whatever k (module docstring)
    verify_cost: CostCurve = field(default_factory=CostCurve)  # seconds by n * (k + 1)
    fixed_cost: LineFit = field(default_factory=LineFit)  # seconds by `draft_width`
    banked_s: float = 0.0  # predicted seconds of the cycles since the last exploration
    probes: int = 0  # explorations so far
    try_cycles: int = TRY_CYCLES  # cycles a try of the other kind lasts
    trying: tuple[int, int] = (0, 0)  # the k being tried, and its cycles still to run
    last_k: int | None = None  # the k of the last cycle observed, None before the first

    def __post_init__(self) -> None:
        self.drafted = Acceptance(self.block)
        self.looked_up = {n: Acceptance(self.block) for n in range(MIN_N, MAX_N + 1)}

    def choose(self, rows: int, exploring_allowed: bool = True) -> int:
        """k for the next cycle of `rows` sequences, all drafted by the drafter."""
        return self.plan([(0, 0)] * rows, exploring_allowed).k

    def plan(self, found: list[tuple[int, int]], exploring_allowed: bool = True) -> Plan:
        """The next cycle of len(found) sequences, where found[r] is row r's prompt-lookup
        draft as (its length, the length n of the suffix it matched); (0, 0): none, or lookup
        not allowed for the row."""
        rows = len(found)
        if self.verify_cost.weight == 0:
            return Plan(self.block)
        tried, left = self.trying
        if left and exploring_allowed:
            self.trying = (tried, left - 1)
            return Plan(tried)
        reach = self.drafted.reach()
        committed = list(accumulate(reach))  # [B + 1]: tokens a k-cycle commits per row
        rates = [rows * committed[k] / max(self.cost(rows, k), 1e-9) for k in range(self.block + 1)]
        best_k = max(range(self.block + 1), key=rates.__getitem__)  # the first of equals
        lookup = self._lookup_plan(found, committed)
        if lookup is not None and lookup[0] > rates[best_k]:
            self.banked_s += lookup[1]
            return lookup[2]
        self.banked_s += self.cost(rows, best_k)
        probe = self._probe(best_k, reach)
        if probe is None or not exploring_allowed:
            return Plan(best_k)
        cycles = self.try_cycles if (probe == 0) != (best_k == 0) else 1  # of the other kind
        lost_s = cycles * (self.cost(rows, probe) - rows * committed[probe] / rates[best_k])
        if lost_s > EXPLORE_SHARE * self.banked_s:
            return Plan(best_k)
        self.banked_s = 0.0
        self.probes += 1
        self.trying = (probe, cycles - 1)
        return Plan(probe)

    def _lookup_plan(
        self, found: list[tuple[int, int]], committed: list[float]
    ) -> tuple[float, float, Plan] | None:
        """The best cycle that verifies some rows' lookup drafts, as (tokens a second,
        predicted seconds, plan): every row with one verifying it, the others stepping plain;
        or the drafter drafting for the rows whose lookup draft is expected to commit less than
        its own would (and those without one). None if no row has a lookup draft."""
        hits = frozenset(row for row, (length, _) in enumerate(found) if length)
        if not hits:
            return None
        mine = {n: list(accumulate(seen.reach())) for n, seen in self.looked_up.items()}
        best: tuple[float, float, Plan] | None = None
        for drafting in (False, True):
            for k in range(1, self.block + 1):
                expected = {row: mine[found[row][1]][min(k, found[row][0])] for row in hits}
                if drafting:
                    expected = {row: t for row, t in expected.items() if t > committed[k]}
                rest = len(found) - len(expected)
                if drafting and not rest:
                    continue  # nothing to draft for: the plan without the drafter
                tokens = sum(expected.values()) + rest * (committed[k] if drafting else 1.0)
                seconds = self.verify_cost(len(found) * (k + 1))
                seconds += self.fixed_cost(self.draft_width(rest, k)) if drafting else 0.0
                rate = tokens / max(seconds, 1e-9)
                if best is None or rate > best[0]:
                    best = (rate, seconds, Plan(k, frozenset(expected), drafting))
        return best

    def _probe(self, best_k: int, reach: list[float]) -> int | None:
        """The k the next exploration tries: deeper and plain in turns (module docstring)."""
        deep = sum(1 for chance in reach[: self.block] if chance >= REACH_FLOOR)
        turns = [k for k in (min(self.block, max(best_k + 1, deep)), 0) if k != best_k]
        return turns[self.probes % len(turns)] if turns else None

    def start_from(self, seconds: dict[int, float]) -> None:
        """Seeds the verify-cost fit with measured forwards: tokens in the forward -> seconds."""
        for width, spent in seconds.items():
            self.verify_cost.add(width, spent)

    def cost(self, rows: int, k: int) -> float:
        """Predicted seconds of a cycle of `rows` sequences verifying k drafted tokens each."""
        drafting = self.fixed_cost(self.draft_width(rows, k)) if k else 0.0
        return self.verify_cost(rows * (k + 1)) + drafting

    def draft_width(self, rows: int, k: int) -> int:
        """Positions the drafter runs over in a cycle of `rows` sequences verifying k drafted
        tokens each: k + 1 a row, or B + 1 where it drafts the whole block (`whole_block`)."""
        return rows * ((self.block if self.whole_block else k) + 1)

    def observe(
        self,
        rows: int,
        k: int,
        accepted: list[int],
        fixed_s: float,
        verify_s: float,
    ) -> None:
        """One cycle of `rows` sequences: k verified per row, `accepted` drafted tokens kept per
        row the drafter drafted for, and the seconds spent drafting and correcting for them (0
        when k is 0 or none drafted) and verifying. The verify's seconds are learnt where the
        cycle before was of its kind (module docstring)."""
        self.observe_acceptance(k, accepted)
        if self.last_k is not None and (k == 0) == (self.last_k == 0):
            self.verify_cost.add(rows * (k + 1), verify_s)
        self.last_k = k
        if k and accepted:
            self.fixed_cost.add(self.draft_width(len(accepted), k), fixed_s)

    def observe_lookups(self, outcomes: list[tuple[int, int, int]]) -> None:
        """Per row (n, accepted, known): its lookup draft, which matched n tokens, compared
        with what the cycle committed (`Acceptance.observe`)."""
        for n, seen in self.looked_up.items():
            seen.observe([(held, known) for length, held, known in outcomes if length == n])

    def observe_acceptance(self, k: int, accepted: list[int]) -> None:
        """k drafter tokens verified per row, of which `accepted` held per row."""
        self.drafted.observe([(held, k) for held in accepted])
