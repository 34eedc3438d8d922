"""Speculation counters from a server's Prometheus `/metrics`, read before and after each turn
of requests, and the cross-check of the accepted length the responses' `usage` implies
against the one the counters' deltas give.

Two families are known, ours (a worker's `/metrics`) and vLLM's:

    cycles    dcoco_spec_cycles_total            vllm:spec_decode_num_drafts_total
    drafted   dcoco_spec_draft_tokens_total      vllm:spec_decode_num_draft_tokens_total
    accepted  dcoco_spec_accepted_tokens_total   vllm:spec_decode_num_accepted_tokens_total
    B         the `position` labels of dcoco_spec_accepted_tokens_per_position_total, or of
              vllm:spec_decode_num_accepted_tokens_per_pos_total: one per draft slot

Each counter is summed over all its label sets, so the deltas cover every request the server
ran in between, this benchmark's or not: point it at a server nobody else uses. A variant that
asks for one speculation method (`Server.speculation`) counts only the series of that `method`
where the counters carry the label (ours do).
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
PER_POSITION = {
    "dcoco": "dcoco_spec_accepted_tokens_per_position_total",
    "vllm": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
}
AGREEMENT = 0.02  # relative difference under which a given block size matches the counters'


class ScrapeFailed(Exception):
    """The metrics endpoint did not answer with Prometheus text."""


@dataclass(frozen=True)
class Counters:
    family: str
    cycles: float
    drafted: float
    accepted: float
    slots: int = 0  # B, the draft slots the per-position counter has; 0 when it is absent

    def __sub__(self, earlier: "Counters") -> "Counters":
        return Counters(
            self.family,
            self.cycles - earlier.cycles,
            self.drafted - earlier.drafted,
            self.accepted - earlier.accepted,
            max(self.slots, earlier.slots),
        )

    def __add__(self, other: "Counters") -> "Counters":
        return Counters(
            self.family,
            self.cycles + other.cycles,
            self.drafted + other.drafted,
            self.accepted + other.accepted,
            max(self.slots, other.slots),
        )


def parse_counters(text: str, method: str | None = None) -> Counters | None:
    """The speculation counters in Prometheus text (only `method`'s series, when given, of
    counters labelled by method), or None when it has neither family."""
    totals: dict[str, float] = {}
    positions: dict[str, set[str]] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if method is not None and sample.labels.get("method", method) != method:
                    continue
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
                if "position" in sample.labels:
                    positions.setdefault(sample.name, set()).add(sample.labels["position"])
    except ValueError as problem:
        raise ScrapeFailed(f"not Prometheus text ({problem})") from None
    for name, (cycles, drafted, accepted) in FAMILIES.items():
        if cycles in totals:
            return Counters(
                name,
                totals[cycles],
                totals.get(drafted, 0.0),
                totals.get(accepted, 0.0),
                len(positions.get(PER_POSITION[name], ())),
            )
    return None


async def fetch_text(http: aiohttp.ClientSession, url: str, timeout_s: float) -> str:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as reply:
            if reply.status != 200:
                raise ScrapeFailed(f"GET {url} answered HTTP {reply.status}")
            return await reply.text()
    except (aiohttp.ClientError, TimeoutError) as problem:
        raise ScrapeFailed(f"GET {url} failed: {type(problem).__name__} {problem}") from None


async def scrape(
    http: aiohttp.ClientSession, url: str, timeout_s: float, method: str | None = None
) -> Counters | None:
    return parse_counters(await fetch_text(http, url, timeout_s), method)


def compiling(text: str) -> bool:
    """Whether a worker's metrics say its layers are still compiling: some part with fewer
    shape classes ready than planned, whose compile has not failed (`dcoco_engine_*`)."""
    shapes: dict[tuple[str, str], float] = {}
    failed: set[str] = set()
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "dcoco_engine_compiled_shapes":
                    shapes[sample.labels["part"], sample.labels["state"]] = sample.value
                elif sample.name == "dcoco_engine_compile_failed" and sample.value:
                    failed.add(sample.labels["part"])
    except (ValueError, KeyError) as problem:
        raise ScrapeFailed(f"not Prometheus text ({problem})") from None
    return any(
        shapes.get((part, "ready"), 0.0) < planned and part not in failed
        for (part, state), planned in shapes.items()
        if state == "planned"
    )


def crosscheck(
    accepted: int | None,
    rejected: int | None,
    requests: int,
    delta: Counters | None,
    block: float | None,
) -> dict[str, Any]:
    """Both accepted lengths, and whether usage and the counters tell the same story.

    `accepted` and `rejected` are the sums of the usage of `requests` responses; `block` the
    drafted tokens per cycle when the caller knows it (`--block-size`), else the counters' mean
    drafted / cycles stands in. A server that speculated none of it (a vanilla worker drafts
    nothing) has no accepted length.

    The two count the same drafted tokens, but not quite the same accepted ones. The counters
    count what the verifier accepted, as vLLM's do; usage follows OpenAI's predicted-output
    semantics, where a drafted token that is not in the completion is rejected. So the tokens a
    stop or `max_tokens` cut from a request's last cycle (`cut`) are accepted in the counters
    and rejected in usage: at most B per request, B being the counters' draft slots (or the
    given block, or drafted / cycles when neither is known). They agree when the drafted
    totals are equal and 0 <= cut <= B x requests."""
    counted = delta if delta is not None and delta.cycles > 0 and delta.drafted > 0 else None
    metrics_block = counted.drafted / counted.cycles if counted else None
    used_block = block or metrics_block
    from_usage: float | None = None
    usage_drafted: int | None = None
    cut: float | None = None
    agree: bool | None = None
    if accepted is not None and rejected is not None:
        from_usage = accepted_length(accepted, rejected, used_block)
        usage_drafted = accepted + rejected
    from_metrics = 1.0 + counted.accepted / counted.cycles if counted else None
    if counted and metrics_block and from_usage is not None and accepted is not None:
        cut = counted.accepted - accepted
        agree = (
            usage_drafted == round(counted.drafted)
            and (block is None or abs(block - metrics_block) <= AGREEMENT * block)
            and 0 <= cut <= (counted.slots or block or metrics_block) * requests
        )
    return {
        "family": delta.family if delta else None,
        "usage_accepted": accepted,
        "usage_drafted": usage_drafted,
        "metrics_cycles": delta.cycles if delta else None,
        "metrics_drafted": delta.drafted if delta else None,
        "metrics_accepted": delta.accepted if delta else None,
        "cut": cut,
        "block": used_block,
        "block_source": "given" if block else ("metrics" if metrics_block else None),
        "accepted_length_usage": from_usage,
        "accepted_length_metrics": from_metrics,
        "agree": agree,
    }
