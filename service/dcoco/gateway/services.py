"""The objects one gateway app shares between its routes."""

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import anyio
from starlette.requests import Request

from dcoco.gateway.catalog import Catalog
from dcoco.gateway.guard import Guard
from dcoco.gateway.jobs import Jobs
from dcoco.gateway.metrics import GatewayMetrics
from dcoco.queue.client import GatewayQueue
from dcoco.settings import GatewaySettings

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class Services:
    settings: GatewaySettings
    queue: GatewayQueue
    catalog: Catalog
    guard: Guard
    jobs: Jobs
    metrics: GatewayMetrics
    cpu: anyio.CapacityLimiter  # the threads for CPU-bound request work
    broken: bool = False  # a background loop kept crashing: /healthz fails

    async def offload(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Runs CPU-bound request work (parsing, templating, tokenizing) on a bounded pool of
        threads, so one large request cannot stall every stream on the event loop."""
        call = functools.partial(work, *args, **kwargs)
        return await anyio.to_thread.run_sync(call, limiter=self.cpu)


def services_of(request: Request) -> Services:
    services = request.app.state.services
    assert isinstance(services, Services)
    return services
