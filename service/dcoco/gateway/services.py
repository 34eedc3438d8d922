"""The objects one gateway app shares between its routes."""

from dataclasses import dataclass

from dcoco.gateway.catalog import Catalog
from dcoco.gateway.guard import Guard
from dcoco.gateway.jobs import Jobs
from dcoco.gateway.lanes import Lanes
from dcoco.gateway.metrics import GatewayMetrics
from dcoco.queue.client import GatewayQueue
from dcoco.settings import GatewaySettings


@dataclass
class Services:
    settings: GatewaySettings
    queue: GatewayQueue
    catalog: Catalog
    guard: Guard
    jobs: Jobs
    metrics: GatewayMetrics
    lanes: Lanes  # the threads that parse and tokenize request bodies
    broken: bool = False  # a background loop kept crashing: /healthz fails
