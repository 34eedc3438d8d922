"""The Grafana dashboard and the alert rules: the committed JSON is the generator's output, the
rules pass promtool, and every PromQL expression of both runs on a real Prometheus that scraped a
real stack (redis-server, worker and gateway processes) after traffic, the core panels with data.
"""

import json
import math
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dcoco.serve import free_port
from factories import write_models
from stack import Stack, fetch, http_status, metric_values, wait_for

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "monitoring"))

import dashboard  # noqa: E402

FILES = ROOT / "helm" / "dcoco" / "files"
BOARD = json.loads((FILES / "dcoco-dashboard.json").read_text())
RULES = yaml.safe_load((FILES / "dcoco-rules.yaml").read_text())
FIRST_SERIES = (
    "dcoco_spec_cycles_total",
    "dcoco_time_to_first_token_seconds_count",
    "dcoco_inter_token_latency_seconds_count",
)
WINDOW = "1m"  # stands for $__rate_interval: covers the whole burst of traffic below


def panels() -> list[dict[str, Any]]:
    return [p for p in BOARD["panels"] if p["type"] != "row"]


def vllm_panel(panel: dict[str, Any]) -> bool:
    return any("vllm:" in t["expr"] for t in panel["targets"])


def promql(expr: str, model: str) -> str:
    """A panel query as Grafana sends it with model = `model` and instance = All."""
    return (
        expr.replace("$__rate_interval", WINDOW).replace("$model", model).replace("$instance", ".*")
    )


def require(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        raise RuntimeError(f"{tool} is not installed: run `make setup` (Debian's prometheus)")
    return found


def test_committed_dashboard_is_the_generator_output() -> None:
    assert (FILES / "dcoco-dashboard.json").read_text() == dashboard.render()


def test_dashboard_variables_and_panels() -> None:
    assert [v["name"] for v in BOARD["templating"]["list"]] == ["datasource", "model", "instance"]
    titles = {p["title"] for p in panels()}
    required = {
        "Mean accepted length",
        "Accepted length distribution",
        "Acceptance by draft position",
        "Corrector rescue and override rates",
        "Cycle time by phase",
        "Correction share of the cycle",
        # A/B of speculation methods in one deployment (requests name their own)
        "Accepted length by method",
        "Tokens / s per stream by method",
        "Generated tokens / s by method",
        "Cycle time by method",
        "Time to first token",
        "Inter-token latency",
        "End-to-end latency",
        "Generated tokens / s",
        "Garbage collection pauses",
        "Queue depth",
        "Queue wait",
        "Rejections by reason",
        "Live workers",
        "Capacity and generated tokens / s",
        "Backlog",
        "Backlog in seconds of work",
        # vLLM's spec-decode dashboard, at parity
        "vLLM draft acceptance rate",
        "vLLM acceptance length",
        "vLLM accepted tokens / s",
        "vLLM draft tokens / s",
        "vLLM drafts / s",
        "vLLM acceptance by draft position",
        "vLLM proposed, accepted and rejected tokens / s",
    }
    assert required <= titles, required - titles
    heat = next(p for p in panels() if p["type"] == "heatmap")
    assert heat["targets"][0]["format"] == "heatmap"
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            process_wide = ("dcoco_requests_total", "dcoco_rejected", "dcoco_gc_")
            if any(name in target["expr"] for name in process_wide):
                continue  # gateway-wide counters and each process's collector: no model label
            label = "model_name" if "vllm:" in target["expr"] else "model"
            assert f'{label}=~"$model"' in target["expr"], (panel["title"], target["expr"])


def test_promtool_checks_the_rules_and_every_alert_fires_in_its_unit_test() -> None:
    """Also the capacity tests: the recording rules, and the workers KEDA's capacity trigger
    asks for (tests/test_helm.py checks the chart renders the query they evaluate)."""
    promtool = require("promtool")
    checked = subprocess.run(
        [promtool, "check", "rules", str(FILES / "dcoco-rules.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [
            promtool,
            "test",
            "rules",
            str(ROOT / "monitoring" / "alerts-test.yaml"),
            str(ROOT / "monitoring" / "capacity-test.yaml"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {r["alert"] for g in RULES["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load((ROOT / "monitoring" / "alerts-test.yaml").read_text())["tests"]
    fired = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case.get("exp_alerts")
    }
    assert fired == alerts


class Prometheus:
    """A real Prometheus scraping the stack every second, with the chart's rule file loaded."""

    def __init__(self, folder: Path, targets: dict[str, list[str]]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(FILES / "dcoco-rules.yaml")],
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": hosts}]}
                for job, hosts in targets.items()
            ],
        }
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = (folder / "prometheus.log").open("wb")
        self.process = subprocess.Popen(
            [
                require("prometheus"),
                f"--config.file={folder / 'prometheus.yml'}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=self.log,
            stderr=self.log,
        )
        wait_for(lambda: http_status(f"{self.url}/-/ready") == 200, 30, "Prometheus")

    def query(self, expr: str, at: float | None = None) -> httpx.Response:
        """An instant query, at `at` (Unix seconds) where given, else now."""
        params = {"query": expr} | ({} if at is None else {"time": str(at)})
        return httpx.get(f"{self.url}/api/v1/query", params=params, timeout=10)

    def values(self, expr: str, at: float | None = None) -> list[float]:
        reply = self.query(expr, at)
        reply.raise_for_status()
        return [float(r["value"][1]) for r in reply.json()["data"]["result"]]

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()


@pytest.fixture(scope="module")
def scraped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Stack, Prometheus]]:
    """The stack after some traffic, and a Prometheus that has scraped it since."""
    models = write_models(tmp_path_factory.mktemp("models"))
    stack = Stack(tmp_path_factory.mktemp("stack"), models).start()
    prometheus = Prometheus(
        tmp_path_factory.mktemp("prometheus"),
        {
            "gateway": [f"127.0.0.1:{stack.port}"],
            "worker": [f"127.0.0.1:{p}" for p in stack.metrics_ports],
        },
    )
    try:
        wait_for(lambda: prometheus.values('sum(up{job=~"gateway|worker"})') == [2.0], 30, "up")
        with httpx.Client(base_url=stack.url, timeout=60) as client:
            body = {"model": Stack.MODEL, "max_tokens": 24, "temperature": 0}
            for i in range(8):
                if i == 2:  # the series exist (one plain request, one streamed: the latency
                    # histograms see only streams) and are scraped before the rest of the
                    # traffic grows them: on a fast machine all of it lands between two
                    # scrapes, and a rate over a series first seen at its final value is zero.
                    # The gateway and the worker are scraped apart, so each waits.
                    for series in FIRST_SERIES:
                        wait_for(
                            lambda series=series: prometheus.values(f"sum({series})") != [],
                            30,
                            f"the first scrape of {series}",
                        )
                message = [{"role": "user", "content": f"def add(a, b):  # {i}"}]
                reply = client.post(
                    "/v1/chat/completions",
                    # The last ones stream, so that the latency panels (rates over a short
                    # window) still see them on a slow machine.
                    json=body | {"messages": message, "stream": i % 2 == 1},
                )
                assert reply.status_code == 200, reply.text
            bad = client.post("/v1/chat/completions", json=body | {"messages": "not a list"})
            assert bad.status_code == 400  # a rejection, for the rejections panel
        settled = 'sum(dcoco_requests_total{route="/v1/chat/completions"})'
        wait_for(lambda: prometheus.values(settled) == [9.0], 30, "the traffic to be scraped")
        time.sleep(2)  # a couple more scrapes, so every rate has two samples after the traffic
        yield stack, prometheus
    finally:
        prometheus.stop()
        stack.stop()


@pytest.mark.slow
def test_every_query_parses_and_the_core_panels_return_data(
    scraped: tuple[Stack, Prometheus],
) -> None:
    _, prometheus = scraped
    empty = []
    for panel in panels():
        for target in panel["targets"]:
            expr = promql(target["expr"], Stack.MODEL)
            reply = prometheus.query(expr)
            assert reply.status_code == 200, (panel["title"], expr, reply.text)  # 400: bad query
            if vllm_panel(panel):
                continue  # no vLLM worker here: the query must parse, data cannot exist
            values = [float(r["value"][1]) for r in reply.json()["data"]["result"]]
            if not values or not all(math.isfinite(v) for v in values):
                empty.append((panel["title"], target["legendFormat"], values))
    assert empty == [], empty
    accepted_length = prometheus.values(promql(panels()[0]["targets"][0]["expr"], Stack.MODEL))
    assert 1.0 <= accepted_length[0] <= 5.0  # block size 4: 1..B+1 tokens per cycle
    models = httpx.get(
        f"{prometheus.url}/api/v1/label/model/values",
        params={"match[]": "dcoco_queue_depth"},
        timeout=10,
    ).json()["data"]
    assert models == [Stack.MODEL]  # what the `model` variable lists


@pytest.mark.slow
def test_every_rule_expression_parses_and_the_rules_evaluate(
    scraped: tuple[Stack, Prometheus],
) -> None:
    _, prometheus = scraped
    for group in RULES["groups"]:
        for rule in group["rules"]:
            reply = prometheus.query(rule["expr"])
            assert reply.status_code == 200, (rule.get("alert", rule.get("record")), reply.text)

    def evaluated(kind: str, count: int) -> bool:
        query = urllib.parse.urlencode({"type": kind})
        groups = httpx.get(f"{prometheus.url}/api/v1/rules?{query}", timeout=10).json()
        rules = [r for g in groups["data"]["groups"] for r in g["rules"]]
        return len(rules) == count and all(r["health"] == "ok" for r in rules)

    wait_for(lambda: evaluated("alert", 7), 20, "the alert rules to evaluate healthy")
    wait_for(lambda: evaluated("record", 6), 20, "the recording rules to evaluate healthy")
    firing = httpx.get(f"{prometheus.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
    assert [a for a in firing if a["state"] == "firing"] == []  # a healthy stack raises nothing
    # The stack's measured capacity: accepted length (1..B+1, B = 4) x 32 / cycle time. The three
    # are read as of one finished rule evaluation (3 s back), not each at its own "now": the rates
    # move with every evaluation. The rules may have recorded them for less than that yet.
    names = (
        "model:dcoco_worker_capacity_tokens_per_second:rate5m",
        "model:dcoco_spec_accepted_length:rate5m",
        "model:dcoco_spec_cycle_seconds:mean5m",
    )
    reads: list[list[float]] = []

    def recorded_3_s_back() -> bool:
        at = time.time() - 3
        reads[:] = [prometheus.values(name, at) for name in names]
        return all(reads)

    wait_for(recorded_3_s_back, 20, "the capacity rules' values 3 s back")
    capacity, (length,), (cycle,) = reads
    assert 1.0 <= length <= 5.0
    assert capacity == [pytest.approx(length * 32 / cycle)]
    assert prometheus.values("model:dcoco_backlog_tokens:sum") == [0.0]  # the traffic is done


def backlog(stack: Stack) -> float:
    """The gateway's dcoco_backlog_tokens for the stack's model."""
    series = metric_values(fetch(f"{stack.url}/metrics"))
    return series[f'dcoco_backlog_tokens{{model="{Stack.MODEL}"}}']


@pytest.mark.slow
def test_the_backlog_counts_max_tokens_while_requests_wait_and_nothing_once_answered(
    scraped: tuple[Stack, Prometheus],
) -> None:
    """With the worker stopped (SIGSTOP), two requests wait: their max_tokens are the backlog;
    once the worker resumes and answers them, nothing is left."""
    stack, _ = scraped
    worker = stack.workers[0]
    body = {"model": Stack.MODEL, "messages": [{"role": "user", "content": "x = "}]}
    worker.signal(signal.SIGSTOP)
    try:
        with httpx.Client(base_url=stack.url, timeout=60) as client, ThreadPoolExecutor(2) as pool:
            replies = [
                pool.submit(client.post, "/v1/chat/completions", json=body | {"max_tokens": n})
                for n in (24, 7)
            ]
            wait_for(lambda: backlog(stack) == 31, 10, "the waiting requests' max_tokens")
            worker.signal(signal.SIGCONT)
            assert [r.result().status_code for r in replies] == [200, 200]
    finally:
        worker.signal(signal.SIGCONT)
    assert backlog(stack) == 0
