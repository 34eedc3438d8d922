"""`dcoco bench --embedded`: real `dcoco serve` stacks, one per variant; a variant that cannot
start, or that names a setting the worker does not know, is reported as failed, and the rest
are measured and stopped."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from dcoco.bench import variants
from dcoco.cli import build_parser
from dcoco.commands import bench
from dcoco.paths import TINY_MODELS


def test_a_setting_the_worker_does_not_know_is_caught_before_starting() -> None:
    assert variants.unknown_settings({"DCOCO_MODE": "dcoco", "DCOCO_MAX_BATCH_SIZE": "4"}) == []
    assert variants.unknown_settings({"DCOCO_NOT_A_SETTING": "1", "PATH": "/bin"}) == [
        "DCOCO_NOT_A_SETTING"
    ]
    env = variants.variant_env("dflash", Path("/m"))
    assert env == {
        "DCOCO_TARGET": "/m/target",
        "DCOCO_MODE": "dflash",
        "DCOCO_DRAFTER": "/m/dflash",
        "DCOCO_ADAPTIVE": "false",
    }


def test_shapes_left_are_read_from_the_workers_compile_gauges() -> None:
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from dcoco.worker.metrics import CompiledLayersCollector

    def scraped(**parts: SimpleNamespace) -> str:
        registry = CollectorRegistry()
        guard = SimpleNamespace(pauses=0, allows=lambda: True)
        registry.register(CompiledLayersCollector("m", parts, guard))
        return generate_latest(registry).decode()

    shapes = [(1, 1), (1, 2), (2, 1), (8, 1)]
    target = SimpleNamespace(shapes=shapes, compiled=shapes[:1], error=None)
    drafter = SimpleNamespace(shapes=shapes[:2], compiled=[], error=None)
    assert variants.shapes_left(scraped(target=target, drafter=drafter)) == 5
    # A part whose compile failed runs eagerly for good: nothing to wait for.
    drafter.error = "inductor failed"
    assert variants.shapes_left(scraped(target=target, drafter=drafter)) == 3
    target.compiled = shapes
    assert variants.shapes_left(scraped(target=target, drafter=drafter)) == 0
    assert variants.shapes_left("# an engine that compiles nothing\n") == 0


@pytest.mark.slow
def test_failed_variants_are_reported_and_the_others_measured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        variants,
        "VARIANTS",
        {
            "instant": {"DCOCO_ENGINE": "instant"},  # the fixture engine: no model runs
            "unknown": {"DCOCO_ENGINE": "instant", "DCOCO_NOT_A_SETTING": "true"},
            "broken": {"DCOCO_MODE": "nonsense"},  # the worker refuses it and exits
        },
    )
    stopped: list[variants.Stack] = []
    original_stop = variants.stop

    def stop(stack: variants.Stack) -> None:
        original_stop(stack)
        stopped.append(stack)

    monkeypatch.setattr(variants, "stop", stop)
    out = tmp_path / "out"
    flags = "--suites code --limit 1 --concurrency 1 --modes greedy --max-tokens 4 --warmup 1"
    flags += " --no-progress"
    paths = ["--out", str(out), "--logs", str(tmp_path / "logs")]
    args = build_parser().parse_args(["bench", "--embedded", "vanilla", *flags.split(), *paths])
    args.embedded = ["instant", "unknown", "broken"]
    bench.run(args)
    report = json.loads((out / "bench.json").read_text())
    assert [s["name"] for s in report["servers"]] == ["instant"]
    assert report["failed"]["unknown"] == (
        "DCOCO_NOT_A_SETTING: not a setting of this build's worker"
    )
    assert report["failed"]["broken"].startswith("did not start (exited with status 1")
    (row,) = report["by_level"]
    # One prompt, cycled to the two waves a level sends at least.
    assert row["server"] == "instant"
    assert row["completed"] == 2
    assert row["output_tokens"] == 8
    # The worker's own /metrics answered; the instant engine runs no cycles to count.
    assert any("instant: no speculation counters at http" in n for n in report["notes"])
    assert not any("still compiling" in n for n in report["notes"])  # it compiles nothing
    assert "failed: DCOCO_NOT_A_SETTING" in (out / "bench.md").read_text()
    assert sorted(s.name for s in stopped) == ["broken", "instant"]
    assert all(s.process.poll() is not None for s in stopped)


@pytest.mark.slow
def test_sigterm_stops_the_stacks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(variants, "VARIANTS", {"instant": {"DCOCO_ENGINE": "instant"}})
    before = signal.getsignal(signal.SIGTERM)
    stacks: list[variants.Stack] = []

    def terminated_while_measuring() -> None:
        with variants.embedded(["instant"], TINY_MODELS, tmp_path) as (ready, failed):
            assert failed == {}
            stacks.extend(ready)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)  # the handler raises before this ends

    with pytest.raises(SystemExit) as exit_:
        terminated_while_measuring()
    assert exit_.value.code == 128 + signal.SIGTERM
    (stack,) = stacks
    assert stack.process.poll() is not None
    assert signal.getsignal(signal.SIGTERM) is before
