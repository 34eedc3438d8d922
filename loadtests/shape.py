"""The concurrent-stream sweep: 4 -> 8 -> 16 -> 32 users, each held for --stage-seconds, then
stop. Load it next to the locustfile (`-f loadtests/locustfile.py,loadtests/shape.py`, as
loadtests/locust.conf does); locust then ignores -u, -r and -t.

It also writes one row per stage to --sweep-report (Markdown): requests, failures, request and
output-token throughput, TTFT, inter-chunk latency, time per output token and the drafted-token
acceptance the users recorded as METRIC entries.
"""

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from locust import LoadTestShape, events
from locust.argument_parser import LocustArgumentParser

REQUEST = "/v1/chat/completions (stream)"


@events.init_command_line_parser.add_listener
def add_arguments(parser: LocustArgumentParser) -> None:
    group = parser.add_argument_group("sweep")
    group.add_argument("--stages", default="4,8,16,32", help="concurrent users per stage")
    group.add_argument("--stage-seconds", type=float, default=30.0, help="seconds per stage")
    group.add_argument("--sweep-report", default="", help="Markdown file for the stage table")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class Stage:
    users: int
    requests: int = 0
    failures: int = 0
    tokens: int = 0
    accepted: int = 0
    samples: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.samples.setdefault(name, []).append(value)

    def row(self, seconds: float) -> str:
        ttft, itl, tpot = (self.samples.get(k, []) for k in ("ttft", "itl_chunk", "tpot"))
        acceptance = self.samples.get("acceptance_pct", [])
        cells = [
            f"{self.users}",
            f"{self.requests}",
            f"{self.failures}",
            f"{self.requests / seconds:.2f}",
            f"{self.tokens / seconds:.0f}",
            *(f"{percentile(ttft, q):.0f}" for q in (0.5, 0.9, 0.99)),
            f"{percentile(itl, 0.5):.1f}",
            f"{percentile(tpot, 0.5):.1f}",
            f"{self.accepted / max(1, self.requests - self.failures):.1f}",
            f"{sum(acceptance) / len(acceptance):.1f}" if acceptance else "n/a",
        ]
        return "| " + " | ".join(cells) + " |"


HEADER = (
    "| streams | requests | failures | req/s | output tokens/s | TTFT p50 ms | TTFT p90 ms "
    "| TTFT p99 ms | ITL p50 ms (chunk) | TPOT p50 ms | accepted drafted tokens / request "
    "| drafted tokens accepted % |\n" + "|" + "---:|" * 12
)


class StreamSweep(LoadTestShape):
    """Holds each user count for --stage-seconds; spawns each stage at once."""

    def __init__(self) -> None:
        super().__init__()
        self.stages: list[Stage] = []
        self.current: Stage | None = None
        self.seconds = 0.0
        events.request.add_listener(self.on_request)
        events.test_stop.add_listener(self.on_stop)

    def tick(self) -> tuple[int, float] | None:
        options = self.runner.environment.parsed_options
        if not self.stages:
            self.seconds = float(options.stage_seconds)
            self.stages = [Stage(int(n)) for n in str(options.stages).split(",")]
        index = int(self.get_run_time() // self.seconds)
        if index >= len(self.stages):
            return None
        self.current = self.stages[index]
        return self.current.users, float(self.current.users)

    def on_request(
        self,
        request_type: str,
        name: str,
        response_time: float,
        response_length: int,
        exception: Any = None,
        **kwargs: Any,
    ) -> None:
        stage = self.current
        if stage is None:
            return
        if request_type == "METRIC":
            stage.add(name, response_time)
            if name == "ttft":
                stage.tokens += response_length
            elif name == "accepted_tokens":
                stage.accepted += int(response_time)
        elif name == REQUEST:
            stage.requests += 1
            stage.failures += exception is not None

    def on_stop(self, environment: Any, **kwargs: Any) -> None:
        report = getattr(environment.parsed_options, "sweep_report", "")
        if report and self.stages:
            rows = [stage.row(self.seconds) for stage in self.stages if stage.requests]
            Path(report).write_text(HEADER + "\n" + "\n".join(rows) + "\n")
