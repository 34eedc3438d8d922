"""A test and benchmark fixture: an engine client that answers instantly with a fixed text, so
that what a benchmark measures is the gateway and the queue alone. It is not a serving engine:
it never runs a model."""

import asyncio
from collections.abc import AsyncGenerator

from dcoco.shared.protocol import EngineDelta, EngineRequest
from dcoco.shared.stats import CycleStats, SpecStats

TOKENS_PER_DELTA = 16  # one speculative cycle's worth, like the real engine's deltas


class InstantEngineClient:
    def __init__(self, max_model_len: int, max_concurrency: int, token_ids: list[int]) -> None:
        """`token_ids`: the answer, repeated as needed (ordinary tokens of the tokenizer)."""
        self.max_model_len, self.max_concurrency = max_model_len, max_concurrency
        self.token_ids = token_ids
        self.failure: BaseException | None = None
        self.aborted: set[str] = set()

    async def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]:
        total = request.params.max_tokens
        sent = 0
        while sent < total:
            if request.request_id in self.aborted:
                self.aborted.discard(request.request_id)
                yield EngineDelta([], finished=True, finish_reason="abort")
                return
            size = min(TOKENS_PER_DELTA, total - sent)
            chunk = [self.token_ids[(sent + i) % len(self.token_ids)] for i in range(size)]
            sent += size
            done = sent >= total
            yield EngineDelta(
                chunk,
                finished=done,
                finish_reason="length" if done else None,
                stats=SpecStats(),
                provenance=("target",) * size,  # no drafter: every token is the "target's"
                cycle=sent // TOKENS_PER_DELTA,
            )
            await asyncio.sleep(0)

    async def abort(self, request_id: str) -> None:
        self.aborted.add(request_id)

    def drain_stats(self) -> list[CycleStats]:
        return []

    async def close(self) -> None:
        return None
