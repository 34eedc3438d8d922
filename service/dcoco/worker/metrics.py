"""Prometheus exporter for a worker: speculation, queue wait and token counts.

Useful PromQL (all series carry `model`):

    mean accepted length (bonus included):
        1 + rate(dcoco_spec_accepted_tokens_total[5m]) / rate(dcoco_spec_cycles_total[5m])
    draft acceptance rate:
        rate(dcoco_spec_accepted_tokens_total[5m]) / rate(dcoco_spec_draft_tokens_total[5m])
    acceptance at slot p:
        rate(dcoco_spec_accepted_tokens_per_position_total{position="p"}[5m])
          / rate(dcoco_spec_cycles_total[5m])
    share of accepted tokens the corrector rescued:
        rate(dcoco_spec_corrected_accepted_tokens_total[5m])
          / rate(dcoco_spec_accepted_tokens_total[5m])
    share of drafted tokens that came from prompt lookup (DCOCO_LOOKUP), and their acceptance:
        rate(dcoco_spec_lookup_draft_tokens_total[5m]) / rate(dcoco_spec_draft_tokens_total[5m])
        rate(dcoco_spec_lookup_accepted_tokens_total[5m])
          / rate(dcoco_spec_lookup_draft_tokens_total[5m])
    p99 cycle time:
        histogram_quantile(0.99,
          sum by (le) (rate(dcoco_spec_cycle_seconds_bucket{phase="total"}[5m])))
    a full worker's capacity in tokens a second (accepted length x batch / cycle time):
        (1 + rate(dcoco_spec_accepted_tokens_total[5m]) / rate(dcoco_spec_cycles_total[5m]))
          * dcoco_worker_max_batch_size
          / (rate(dcoco_spec_cycle_seconds_sum{phase="total"}[5m])
             / rate(dcoco_spec_cycle_seconds_count{phase="total"}[5m]))
"""

from collections.abc import Iterator, Mapping
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dcoco.shared.heap import FULL_COLLECTION_HELP, FULL_COLLECTION_SECONDS, PAUSE
from dcoco.shared.stats import CycleStats

SECONDS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
WAIT_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ACCEPTED_LENGTH = (*(float(n) for n in range(1, 17)), 24.0, 32.0)  # 1..B+1 for B <= 31


class CompileState(Protocol):
    """A model's compiled layers (`engine.compiled.CompiledLayers`)."""

    shapes: list[tuple[int, int]]  # the shape classes it compiles
    compiled: list[tuple[int, int]]  # those ready
    error: str | None  # why compiling stopped, if it failed


class StallState(Protocol):
    """The runner's stall guard (`engine.stalls.StallGuard`)."""

    pauses: int

    def allows(self) -> bool: ...


class CompiledLayersCollector(Collector):
    """The torch engine's compiled layers, read at each scrape."""

    def __init__(self, model: str, parts: Mapping[str, CompileState], guard: StallState) -> None:
        self.model, self.parts, self.guard = model, parts, guard

    def collect(self) -> Iterator[Metric]:
        shapes = GaugeMetricFamily(
            "dcoco_engine_compiled_shapes",
            "Shape classes of a model's layers: planned, and compiled and ready",
            labels=["model", "part", "state"],
        )
        failed = GaugeMetricFamily(
            "dcoco_engine_compile_failed",
            "1 where compiling a model's layers failed and they run eagerly",
            labels=["model", "part"],
        )
        for part, state in self.parts.items():
            shapes.add_metric([self.model, part, "planned"], len(state.shapes))
            shapes.add_metric([self.model, part, "ready"], len(state.compiled))
            failed.add_metric([self.model, part], float(state.error is not None))
        paused = GaugeMetricFamily(
            "dcoco_engine_compiled_paused",
            "1 while the stall guard runs the layers eagerly",
            labels=["model"],
        )
        paused.add_metric([self.model], float(not self.guard.allows()))
        pauses = CounterMetricFamily(
            "dcoco_engine_stall_pauses",
            "Times the stall guard turned the compiled layers off",
            labels=["model"],
        )
        pauses.add_metric([self.model], self.guard.pauses)
        yield from (shapes, failed, paused, pauses)


class WorkerMetrics:
    def __init__(self, registry: CollectorRegistry, model: str) -> None:
        self.model, self.registry = model, registry
        m = ["model"]
        spec = ["model", "method"]  # method: the requests' speculation, off/dflash/dcoco
        self.cycles = Counter("dcoco_spec_cycles", "Verification cycles", spec, registry=registry)
        self.gc_full_collections = Histogram(
            FULL_COLLECTION_SECONDS, FULL_COLLECTION_HELP, buckets=PAUSE, registry=registry
        )
        self.draft_tokens = Counter(
            "dcoco_spec_draft_tokens", "Drafted tokens", spec, registry=registry
        )
        self.accepted_tokens = Counter(
            "dcoco_spec_accepted_tokens",
            "Accepted drafted tokens, bonus excluded",
            spec,
            registry=registry,
        )
        self.accepted_per_position = Counter(
            "dcoco_spec_accepted_tokens_per_position",
            "Accepted drafted tokens at each slot",
            ["model", "method", "position"],
            registry=registry,
        )
        self.corrected_tokens = Counter(
            "dcoco_spec_corrected_tokens",
            "Drafted tokens not the top-1 candidate",
            spec,
            registry=registry,
        )
        self.corrected_accepted_tokens = Counter(
            "dcoco_spec_corrected_accepted_tokens",
            "Corrected drafted tokens the verifier accepted",
            spec,
            registry=registry,
        )
        self.lookup_draft_tokens = Counter(
            "dcoco_spec_lookup_draft_tokens",
            "Drafted tokens that came from prompt lookup rather than a drafter",
            spec,
            registry=registry,
        )
        self.lookup_accepted_tokens = Counter(
            "dcoco_spec_lookup_accepted_tokens",
            "Prompt-lookup drafted tokens the verifier accepted",
            spec,
            registry=registry,
        )
        self.acceptance_length = Histogram(
            "dcoco_spec_acceptance_length",
            "Tokens committed per cycle, bonus included",
            spec,
            buckets=ACCEPTED_LENGTH,
            registry=registry,
        )
        self.cycle_seconds = Histogram(
            "dcoco_spec_cycle_seconds",
            "Cycle wall time by phase",
            ["model", "method", "phase"],
            buckets=SECONDS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "dcoco_queue_wait_seconds",
            "Enqueue to worker pickup",
            m,
            buckets=WAIT_SECONDS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "dcoco_prompt_tokens", "Prompt tokens prefilled", m, registry=registry
        )
        self.generation_tokens = Counter(
            "dcoco_generation_tokens", "Tokens generated", m, registry=registry
        )
        self.cancel_latency = Histogram(
            "dcoco_cancel_latency_seconds",
            "Client disconnect (as the gateway saw it) to engine abort",
            m,
            buckets=SECONDS,
            registry=registry,
        )
        self.loop_restarts = Counter(
            "dcoco_worker_loop_restarts",
            "Crashes of a worker loop, each followed by a restart",
            ["model", "loop"],
            registry=registry,
        )
        self.max_batch_size = Gauge(
            "dcoco_worker_max_batch_size",
            "Sequences the worker's engine runs at once (DCOCO_MAX_BATCH_SIZE): its concurrency",
            m,
            registry=registry,
        )
        self.requests = Counter(
            "dcoco_worker_requests",
            "Requests a worker ended, by outcome",
            ["model", "outcome"],
            registry=registry,
        )

    def record_precision(self, precision: str, seconds: dict[str, dict[int, float]]) -> None:
        """The engine's precision, and the forward costs `auto` chose it from (none when the
        precision was set explicitly)."""
        Gauge(
            "dcoco_engine_precision_info",
            "The precision the engine runs in (value 1)",
            ["model", "precision"],
            registry=self.registry,
        ).labels(self.model, precision).set(1)
        forward = Gauge(
            "dcoco_engine_forward_seconds",
            "Measured seconds of one target forward over `tokens` tokens, per precision",
            ["model", "precision", "tokens"],
            registry=self.registry,
        )
        for name, row in seconds.items():
            for tokens, spent in row.items():
                forward.labels(self.model, name, str(tokens)).set(spent)

    def record_compiled(self, parts: Mapping[str, CompileState], guard: StallState) -> None:
        """The compiled layers of each part ("target", "drafter") and the stall guard."""
        self.registry.register(CompiledLayersCollector(self.model, parts, guard))

    def defer_to(self, collector: Collector, names: tuple[str, ...]) -> None:
        """Serves the series `names` from `collector` (an engine that measures them in another
        process) instead of from this exporter."""
        for metric in (self.corrected_tokens, self.corrected_accepted_tokens, self.cycle_seconds):
            if metric._name in names:
                self.registry.unregister(metric)
        self.registry.register(collector)

    def observe_cycle(self, cycle: CycleStats) -> None:
        model, method = self.model, cycle.method
        self.cycles.labels(model, method).inc(cycle.verifications)
        self.draft_tokens.labels(model, method).inc(cycle.draft_tokens)
        self.accepted_tokens.labels(model, method).inc(cycle.accepted_tokens)
        for position, count in enumerate(cycle.accepted_per_position):
            self.accepted_per_position.labels(model, method, str(position)).inc(count)
        self.corrected_tokens.labels(model, method).inc(cycle.corrected_tokens)
        self.corrected_accepted_tokens.labels(model, method).inc(cycle.corrected_accepted_tokens)
        self.lookup_draft_tokens.labels(model, method).inc(cycle.lookup_draft_tokens)
        self.lookup_accepted_tokens.labels(model, method).inc(cycle.lookup_accepted_tokens)
        histogram = self.acceptance_length.labels(model, method)
        for length in cycle.accepted_lengths:
            histogram.observe(length)
        for phase, seconds in cycle.seconds.items():
            self.cycle_seconds.labels(model, method, phase).observe(seconds)
