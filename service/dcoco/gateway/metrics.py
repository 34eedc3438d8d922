"""Prometheus metrics of a gateway: latency as clients see it, requests, rejections, and the
queue depth and live workers per model (refreshed from Redis in the background).

    p50 time to first token:
        histogram_quantile(0.5, sum by (le) (rate(dcoco_time_to_first_token_seconds_bucket[5m])))
    error ratio:
        sum(rate(dcoco_requests_total{status=~"5.."}[5m])) / sum(rate(dcoco_requests_total[5m]))
    connections closed on slow or idle clients, by phase:
        sum by (phase) (rate(dcoco_client_timeouts_total[5m]))
    requests waiting per worker (a KEDA/HPA signal):
        sum by (model) (dcoco_queue_depth) / clamp_min(sum by (model) (dcoco_workers), 1)
    tokens still to generate, over every gateway (each counts the requests it follows):
        sum by (model) (dcoco_backlog_tokens)
"""

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from dcoco.shared.heap import FULL_COLLECTION_HELP, FULL_COLLECTION_SECONDS, PAUSE

LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_GAP = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.ttft = Histogram(
            "dcoco_time_to_first_token_seconds",
            "Request arrival to first content sent",
            ["model"],
            buckets=LATENCY,
            registry=registry,
        )
        self.itl = Histogram(
            "dcoco_inter_token_latency_seconds",
            "Gap between content chunks sent",
            ["model"],
            buckets=TOKEN_GAP,
            registry=registry,
        )
        self.e2e = Histogram(
            "dcoco_e2e_request_latency_seconds",
            "Request arrival to last byte",
            ["model"],
            buckets=LATENCY,
            registry=registry,
        )
        self.requests = Counter(
            "dcoco_requests", "HTTP requests", ["route", "status"], registry=registry
        )
        self.rejected = Counter(
            "dcoco_rejected_requests", "Rejected requests", ["reason"], registry=registry
        )
        self.queue_depth = Gauge(
            "dcoco_queue_depth", "Requests waiting, not picked up", ["model"], registry=registry
        )
        self.workers = Gauge("dcoco_workers", "Live workers", ["model"], registry=registry)
        self.backlog_tokens = Gauge(
            "dcoco_backlog_tokens",
            "Tokens still to generate for the requests this gateway follows: max_tokens of each"
            " waiting request, max_tokens less those received of each running one",
            ["model"],
            registry=registry,
        )
        self.client_timeouts = Counter(
            "dcoco_client_timeouts",
            "Connections closed on a slow or idle client, by phase: idle, headers or body",
            ["phase"],
            registry=registry,
        )
        self.gc_full_collections = Histogram(
            FULL_COLLECTION_SECONDS, FULL_COLLECTION_HELP, buckets=PAUSE, registry=registry
        )
        self.loop_restarts = Counter(
            "dcoco_gateway_loop_restarts",
            "Crashes of a gateway background loop, each followed by a restart",
            ["loop"],
            registry=registry,
        )
