"""The README's configuration and metrics tables cover what the code defines."""

from pathlib import Path

import pytest

from dcoco.settings import GatewaySettings, WorkerSettings

README = (Path(__file__).parents[1] / "README.md").read_text()


@pytest.mark.parametrize("settings", [GatewaySettings, WorkerSettings])
def test_every_setting_is_documented(settings: type[GatewaySettings | WorkerSettings]) -> None:
    for name in settings.model_fields:
        assert f"| `DCOCO_{name.upper()}` |" in README, name


def test_every_exported_metric_is_documented() -> None:
    from prometheus_client import CollectorRegistry

    from dcoco.gateway.metrics import GatewayMetrics
    from dcoco.worker.metrics import WorkerMetrics

    gateway, worker = CollectorRegistry(), CollectorRegistry()  # both export the collector's
    GatewayMetrics(gateway)
    WorkerMetrics(worker, "m")
    for metric in [*gateway.collect(), *worker.collect()]:
        suffix = "_total" if metric.type == "counter" else ""
        assert f"`{metric.name}{suffix}" in README, metric.name
