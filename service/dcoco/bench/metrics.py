"""The benchmark's definitions, as `vllm bench serve` has them, all from the client's side.

- TTFT: from sending the request to the first content chunk.
- E2EL: from sending the request to the end of its stream.
- TPOT: (E2EL - TTFT) / (output tokens - 1); a one-token answer has none.
- ITL per chunk: the gaps between consecutive content chunks.
- ITL per token: a speculative chunk can carry several tokens, so each gap is shared by the
  tokens of the chunk that closes it: a gap of g before a chunk of k tokens counts k times as
  g / k. The size of each chunk is exact when the server streams cumulative usage on every
  chunk; otherwise each chunk of a request is taken to carry that request's mean, output
  tokens / content chunks, and the summary says the figure is estimated.
- Output throughput: output tokens of the completed requests over the wall time of the run.
- Per-stream tokens/s: output tokens over the summed E2EL of the same requests: what one
  stream sees; at concurrency 1 it equals the output throughput.
- Goodput: requests that met every SLO, over the wall time. A failed request meets none; a
  one-token answer meets any TPOT objective.
- Acceptance rate: accepted / (accepted + rejected) drafted tokens, from `usage`.
- Accepted length: tokens committed per verification cycle, the bonus token included:
  1 + accepted / cycles. The client sees no cycles, but with B tokens drafted per cycle,
  cycles = (accepted + rejected) / B, so the accepted length is 1 + B * acceptance rate.

Token counts come from `usage` only, never from counting chunks.
"""

import itertools
import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dcoco.bench.client import Outcome


@dataclass(frozen=True)
class Record:
    server: str
    mode: str
    level: str  # "c4" (four concurrent streams) or "r2.5" (2.5 requests/s)
    suite: str
    outcome: Outcome
    repeat: int = 0  # which pass over the plan (--repeats)


@dataclass(frozen=True)
class Slo:
    """Service-level objectives in seconds; None: no objective."""

    ttft: float | None = None
    tpot: float | None = None
    e2el: float | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.ttft, self.tpot, self.e2el))

    def met(self, outcome: Outcome) -> bool:
        if not outcome.ok:
            return False
        per_token = tpot(outcome)
        return (
            (self.ttft is None or ttft(outcome) <= self.ttft)
            and (self.tpot is None or per_token is None or per_token <= self.tpot)
            and (self.e2el is None or outcome.end <= self.e2el)
        )


def parse_slo(text: str) -> Slo:
    """`ttft=0.5,tpot=50ms,e2el=10s`: seconds unless the value ends in ms."""
    values: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = part.partition("=")
        if not sep or key not in ("ttft", "tpot", "e2el"):
            raise ValueError(f"{part!r}: expected ttft=, tpot= or e2el= followed by a time")
        scale = 1e-3 if raw.endswith("ms") else 1.0
        number = float(raw.removesuffix("ms").removesuffix("s"))
        if not math.isfinite(number) or number <= 0:
            raise ValueError(f"{part!r}: the time must be positive")
        values[key] = number * scale
    return Slo(**values)


def ttft(outcome: Outcome) -> float:
    return outcome.chunk_times[0]


def tpot(outcome: Outcome) -> float | None:
    tokens = outcome.completion_tokens
    return (outcome.end - ttft(outcome)) / (tokens - 1) if tokens > 1 else None


def itl_per_chunk(outcome: Outcome) -> list[float]:
    times = outcome.chunk_times
    return [b - a for a, b in itertools.pairwise(times)]


def exact_token_steps(outcome: Outcome) -> bool:
    """True when the streamed usage accounts for every output token."""
    steps = outcome.token_steps
    return bool(steps) and sum(k for _, k in steps) == outcome.completion_tokens


def itl_per_token(outcome: Outcome) -> list[tuple[float, float]]:
    """(gap per token, tokens sharing it) for every gap after the first token-bearing chunk."""
    if exact_token_steps(outcome):
        steps = outcome.token_steps
        return [((t - s) / k, float(k)) for (s, _), (t, k) in itertools.pairwise(steps)]
    chunks = len(outcome.chunk_times)
    if chunks < 2 or outcome.completion_tokens < 2:
        return []
    mean = outcome.completion_tokens / chunks
    return [(gap / mean, mean) for gap in itl_per_chunk(outcome)]


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks, numpy's default; q in [0, 100]."""
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def weighted_percentile(samples: list[tuple[float, float]], q: float) -> float:
    """The smallest value whose cumulative weight reaches q% of the total."""
    ordered = sorted(samples)
    goal = sum(w for _, w in ordered) * q / 100
    running = 0.0
    for value, weight in ordered:
        running += weight
        if running >= goal:
            return value
    return ordered[-1][0]


QUANTILES = (50, 90, 99)


def distribution(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    summary = {"mean": sum(values) / len(values)}
    return summary | {f"p{q}": percentile(values, q) for q in QUANTILES}


def weighted_distribution(samples: list[tuple[float, float]]) -> dict[str, float] | None:
    total = sum(w for _, w in samples)
    if not samples or total <= 0:
        return None
    summary = {"mean": sum(v * w for v, w in samples) / total}
    return summary | {f"p{q}": weighted_percentile(samples, q) for q in QUANTILES}


def accepted_length(accepted: int, rejected: int, block: float | None) -> float | None:
    drafted = accepted + rejected
    if not drafted or not block:
        return None
    return 1.0 + block * accepted / drafted


def summarize(records: Iterable[Record], duration_s: float, slo: Slo) -> dict[str, Any]:
    """Every figure above over one group of requests that ran in `duration_s` of wall time."""
    every = list(records)
    done = [r.outcome for r in every if r.outcome.ok]
    tokens = sum(o.completion_tokens for o in done)
    streamed = sum(o.end for o in done)
    speculated = [o for o in done if o.accepted is not None]
    accepted = sum(o.accepted or 0 for o in speculated)
    rejected = sum(o.rejected or 0 for o in speculated)
    per_token = [s for o in done for s in itl_per_token(o)]
    return {
        "requests": len(every),
        "completed": len(done),
        "failed": len(every) - len(done),
        "duration_s": duration_s,
        "output_tokens": tokens,
        "output_throughput": tokens / duration_s if duration_s > 0 else None,
        "request_throughput": len(done) / duration_s if duration_s > 0 else None,
        "per_stream_tokens_per_s": tokens / streamed if streamed > 0 else None,
        "ttft_s": distribution([ttft(o) for o in done]),
        "tpot_s": distribution([t for o in done if (t := tpot(o)) is not None]),
        "itl_chunk_s": distribution([g for o in done for g in itl_per_chunk(o)]),
        "itl_token_s": weighted_distribution(per_token),
        "itl_token_exact": bool(done) and all(exact_token_steps(o) for o in done),
        "e2el_s": distribution([o.end for o in done]),
        "goodput": (
            sum(slo.met(r.outcome) for r in every) / duration_s
            if slo.given and duration_s > 0
            else None
        ),
        "accepted_tokens": accepted if speculated else None,
        "rejected_tokens": rejected if speculated else None,
        "acceptance_rate": accepted / (accepted + rejected) if accepted + rejected else None,
        "errors": Counter(str(r.outcome.error) for r in every if not r.outcome.ok).most_common(5),
    }
