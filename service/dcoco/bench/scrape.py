"""Speculation counters from a server's Prometheus `/metrics`, read before and after each turn
of requests, and the cross-check of the accepted length the responses' `usage` implies
against the one the counters' deltas give.

Two families are known, ours (a worker's `/metrics`) and vLLM's:

    cycles    dcoco_spec_cycles_total            vllm:spec_decode_num_drafts_total
    drafted   dcoco_spec_draft_tokens_total      vllm:spec_decode_num_draft_tokens_total
    accepted  dcoco_spec_accepted_tokens_total   vllm:spec_decode_num_accepted_tokens_total

Each counter is summed over all its label sets, so the deltas cover every request the server
ran in between, this benchmark's or not: point it at a server nobody else uses.
"""

from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from dcoco.bench.metrics import accepted_length

FAMILIES = {
    "dcoco": (
        "dcoco_spec_cycles_total",
        "dcoco_spec_draft_tokens_total",
        "dcoco_spec_accepted_tokens_total",
    ),
    "vllm": (
        "vllm:spec_decode_num_drafts_total",
        "vllm:spec_decode_num_draft_tokens_total",
        "vllm:spec_decode_num_accepted_tokens_total",
    ),
}
AGREEMENT = 0.02  # relative difference under which the two accepted lengths agree


class ScrapeFailed(Exception):
    """The metrics endpoint did not answer with Prometheus text."""


@dataclass(frozen=True)
class Counters:
    family: str
    cycles: float
    drafted: float
    accepted: float

    def __sub__(self, earlier: "Counters") -> "Counters":
        return Counters(
            self.family,
            self.cycles - earlier.cycles,
            self.drafted - earlier.drafted,
            self.accepted - earlier.accepted,
        )

    def __add__(self, other: "Counters") -> "Counters":
        return Counters(
            self.family,
            self.cycles + other.cycles,
            self.drafted + other.drafted,
            self.accepted + other.accepted,
        )


def parse_counters(text: str) -> Counters | None:
    """The speculation counters in Prometheus text, or None when it has neither family."""
    totals: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    except ValueError as problem:
        raise ScrapeFailed(f"not Prometheus text ({problem})") from None
    for name, (cycles, drafted, accepted) in FAMILIES.items():
        if cycles in totals:
            return Counters(
                name, totals[cycles], totals.get(drafted, 0.0), totals.get(accepted, 0.0)
            )
    return None


async def scrape(http: aiohttp.ClientSession, url: str, timeout_s: float) -> Counters | None:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
            if reply.status != 200:
                raise ScrapeFailed(f"GET {url} answered HTTP {reply.status}")
            text = await reply.text()
    except (aiohttp.ClientError, TimeoutError) as problem:
        raise ScrapeFailed(f"GET {url} failed: {type(problem).__name__} {problem}") from None
    return parse_counters(text)


def crosscheck(
    accepted: int | None, rejected: int | None, delta: Counters | None, block: float | None
) -> dict[str, Any]:
    """Both accepted lengths, and whether they agree.

    `accepted` and `rejected` are the sums of the responses' usage; `block` the drafted
    tokens per cycle when the caller knows it (`--block-size`), else the counters' mean
    drafted / cycles stands in. A server that speculated none of it (a vanilla worker drafts
    nothing) has no accepted length."""
    spec = delta is not None and delta.cycles > 0 and delta.drafted > 0
    metrics_block = delta.drafted / delta.cycles if spec and delta else None
    used_block = block or metrics_block
    from_usage = (
        accepted_length(accepted, rejected, used_block)
        if accepted is not None and rejected is not None
        else None
    )
    from_metrics = 1.0 + delta.accepted / delta.cycles if spec and delta else None
    agree = None
    if from_usage is not None and from_metrics is not None:
        agree = abs(from_usage - from_metrics) <= AGREEMENT * from_metrics
    return {
        "family": delta.family if delta else None,
        "usage_accepted": accepted,
        "usage_drafted": None if accepted is None or rejected is None else accepted + rejected,
        "metrics_cycles": delta.cycles if delta else None,
        "metrics_drafted": delta.drafted if delta else None,
        "metrics_accepted": delta.accepted if delta else None,
        "block": used_block,
        "block_source": "given" if block else ("metrics" if metrics_block else None),
        "accepted_length_usage": from_usage,
        "accepted_length_metrics": from_metrics,
        "agree": agree,
    }
