"""The series only the plugin can measure, recorded in vLLM's worker process.

vLLM drafts and verifies in its Worker process, two processes away from any HTTP server, so
these series reach a `/metrics` page only through Prometheus multiprocess mode: start vLLM (or
`dcoco worker --engine vllm`, which does it by itself) with `PROMETHEUS_MULTIPROC_DIR` set to an
empty folder. vLLM's own `vllm:spec_decode_*` counters cover drafts and acceptances.

PromQL (all series carry `model`, vLLM's served model name):

    share of drafted tokens the walk corrected:
        rate(dcoco_spec_corrected_tokens_total[5m])
          / rate(vllm:spec_decode_num_draft_tokens_total[5m])
    share of corrected tokens the target accepted:
        rate(dcoco_spec_corrected_accepted_tokens_total[5m])
          / rate(dcoco_spec_corrected_tokens_total[5m])
    correction's share of a cycle:
        rate(dcoco_spec_cycle_seconds_sum{phase="correct"}[5m])
          / rate(dcoco_spec_cycle_seconds_sum{phase="total"}[5m])
"""

import os
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector

# The worker's cycle buckets (dcoco.worker.metrics), so both engines' histograms line up.
SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
PLUGIN_SERIES = (
    "dcoco_spec_corrected_tokens",
    "dcoco_spec_corrected_accepted_tokens",
    "dcoco_spec_cycle_seconds",
)


class PluginMetrics:
    """One per DCOCO drafter in a vLLM worker; a `runtime.CycleSink`."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.exported = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        m = ["model", "method"]  # method: dcoco, the only one the plugin drafts
        # registry=None: in multiprocess mode values live in the folder, and whoever serves
        # /metrics collects them from there; nothing is registered in this process.
        self.corrected = Counter(PLUGIN_SERIES[0], "Drafted tokens not the top-1", m, registry=None)
        self.rescued = Counter(
            PLUGIN_SERIES[1], "Corrected drafted tokens the verifier accepted", m, registry=None
        )
        self.cycle_seconds = Histogram(
            PLUGIN_SERIES[2],
            "Cycle wall time by phase",
            ["model", "method", "phase"],
            buckets=SECONDS,
            registry=None,
        )

    def record(self, corrected: int, rescued: int, seconds: dict[str, float]) -> None:
        self.corrected.labels(self.model, "dcoco").inc(corrected)
        self.rescued.labels(self.model, "dcoco").inc(rescued)
        for phase, value in seconds.items():
            self.cycle_seconds.labels(self.model, "dcoco", phase).observe(value)


class PluginCollector:
    """Serves the plugin's series from a multiprocess folder, and nothing else found there."""

    def __init__(self, folder: Path) -> None:
        self._source = CollectorRegistry()
        MultiProcessCollector(self._source, path=str(folder))

    def collect(self) -> Iterator[Metric]:
        for metric in self._source.collect():
            if metric.name in PLUGIN_SERIES:
                yield metric
