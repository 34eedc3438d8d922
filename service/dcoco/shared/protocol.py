"""The protocol a worker drives, whatever engine is behind it.

An engine client turns requests into async streams of token deltas, aborts requests, and hands
over the per-cycle statistics it gathered. Implementations: the embedded torch engine
(`dcoco.engine.client`) and the instant test fixture (`dcoco.shared.instant`).
"""

from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Protocol

from dcoco.shared.sampling import SamplingParams
from dcoco.shared.stats import CycleStats, SpecStats


@dataclass(frozen=True)
class EngineRequest:
    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class EngineDelta:
    token_ids: list[int]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" | "error"
    stats: SpecStats | None = None  # the request's speculation so far
    error: str | None = None  # why the engine refused or failed the request
    # Where each token came from ("drafted", "corrected", "target"), the draft this cycle
    # rejected, and the request's cycle count; empty where the engine cannot tell (vLLM).
    provenance: tuple[str, ...] = ()
    rejected: tuple[int, ...] = ()
    cycle: int = 0


class EngineClient(Protocol):
    max_model_len: int
    max_concurrency: int
    failure: BaseException | None  # set when the engine can no longer serve

    def generate(self, request: EngineRequest) -> AsyncGenerator[EngineDelta, None]:
        """Deltas until one with finished=True; leaving the iteration early aborts it."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def drain_stats(self) -> list[CycleStats]:
        """Cycle statistics gathered since the last call."""
        ...

    async def close(self) -> None: ...
