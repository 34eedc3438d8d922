"""The locust load test against a real stack: a short sweep through loadtests/locust.conf (the
locustfile and the stage shape), with no failure, and every METRIC the users record."""

import csv
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from factories import write_models
from stack import Stack

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    models = write_models(tmp_path_factory.mktemp("models"))
    running = Stack(tmp_path_factory.mktemp("stack"), models).start()
    yield running
    running.stop()


def test_locust_sweep_has_no_failures(stack: Stack, tmp_path: Path) -> None:
    prefix = tmp_path / "smoke"
    report = tmp_path / "sweep.md"
    command = [
        sys.executable,
        "-m",
        "locust",
        "--config",
        "loadtests/locust.conf",
        "--host",
        stack.url,
        "--model",
        Stack.MODEL,
        "--max-tokens",
        "24",
        "--max-prompt-chars",
        "200",  # the test tokenizer is near character level and the context is 512
        "--stages",
        "2,4",
        "--stage-seconds",
        "5",
        "--csv",
        str(prefix),
        "--sweep-report",
        str(report),
    ]
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=90, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-3000:] + stack.logs()
    with (tmp_path / "smoke_stats.csv").open() as rows:
        stats = {(r["Type"], r["Name"]): r for r in csv.DictReader(rows)}
    requests = stats[("POST", "/v1/chat/completions (stream)")]
    count = int(requests["Request Count"])
    assert count >= 10, output[-3000:]
    assert int(requests["Failure Count"]) == 0
    # One TTFT, TPOT and accepted-token sample per request, several chunk gaps per request.
    for name in ("ttft", "tpot", "accepted_tokens", "acceptance_pct"):
        metric = stats[("METRIC", name)]
        assert int(metric["Request Count"]) == count, name
        assert int(metric["Failure Count"]) == 0
    assert int(stats[("METRIC", "itl_chunk")]["Request Count"]) > count
    assert float(stats[("METRIC", "ttft")]["Median Response Time"]) > 0
    # The test drafter is distilled: some drafted tokens are accepted.
    assert float(stats[("METRIC", "accepted_tokens")]["Average Response Time"]) > 0
    rows = report.read_text().splitlines()
    assert rows[0].startswith("| streams | requests | failures |")
    assert [row.split("|")[1].strip() for row in rows[2:]] == ["2", "4"]
    assert all(row.split("|")[3].strip() == "0" for row in rows[2:])


def test_locust_conf_names_no_host() -> None:
    conf = (ROOT / "loadtests" / "locust.conf").read_text()
    settings = [line.split("=")[0].strip() for line in conf.splitlines() if "=" in line]
    assert "host" not in settings
    assert "locustfile" in settings
