"""`dcoco bench` from the command line: one-line failures, and a whole run against scripted
servers compared, with its JSON, markdown and plots."""

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, get_args

import pytest

from bench_server import Script, ScriptedServer
from dcoco.cli import main
from dcoco.queue.protocol import Speculation
from dcoco.serve import free_port


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    status = main(["bench", "--no-progress", *args])
    return status, capsys.readouterr().err


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://127.0.0.1:8000", "not an http:// or https:// URL with a host"),
        ("localhost:8000", "not an http:// or https:// URL with a host"),
        ("http://", "not an http:// or https:// URL with a host"),
        ("http://127.0.0.1:99999", "bad port"),
        ("http://127.0.0.1:8000/?x=1", "no query or fragment"),
    ],
)
def test_a_bad_url_is_one_line(url: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    status, err = run_cli(["--url", url], capsys)
    assert status == 1
    assert err.startswith("dcoco bench: error: --url")
    assert message in err
    assert err.count("\n") == 1
    assert "Traceback" not in err


def test_an_unreachable_server_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    status, err = run_cli(["--url", url], capsys)
    assert status == 1
    assert err.count("\n") == 1
    assert err.startswith(f"dcoco bench: error: {url}: unreachable (")


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ("html", "not an OpenAI-compatible server (GET /v1/models: text/html, not a JSON model"),
        ("404", "not an OpenAI-compatible server (GET /v1/models: HTTP 404)"),
    ],
)
def test_a_server_that_is_not_openai_compatible_is_one_line(
    reply: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with ScriptedServer(Script(models_reply=reply)) as server:
        status, err = run_cli(["--url", server.url], capsys)
    assert status == 1
    assert err.count("\n") == 1
    assert message in err


def test_a_model_the_server_lacks_and_a_bad_baseline_are_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with ScriptedServer(Script()) as server:
        status, err = run_cli(["--url", server.url, "--model", "other"], capsys)
        assert status == 1
        assert "does not serve 'other'; it serves: scripted" in err
        status, err = run_cli(["--url", server.url, "--baseline", "vanilla"], capsys)
        assert status == 1
        assert "--baseline 'vanilla': expected NAME=URL" in err
        status, err = run_cli(["--url", server.url, "--baseline", "vanilla=nowhere"], capsys)
        assert status == 1
        assert "--baseline vanilla 'nowhere': not an http://" in err
        status, err = run_cli(["--url", server.url, "--slo", "ttft=fast"], capsys)
        assert status == 1
        assert err.startswith("dcoco bench: error: --slo")


def bench_pair(out: Path, capsys: pytest.CaptureFixture[str], args: list[str]) -> dict[str, Any]:
    """Benchmarks a scripted speculative server, `dcoco`, against a slower `vanilla` one (6
    tokens in 2 chunks against 6 in 6, each slower); returns the request bodies each got."""
    fast = Script(chunks=[(0.01, 3), (0.01, 3)], accepted=4, rejected=4, block=4)
    slow = Script(chunks=[(0.02, 1)] * 6, family="dcoco")
    with ScriptedServer(fast) as spec, ScriptedServer(slow) as vanilla:
        servers = ["--url", spec.url, "--name", "dcoco", "--baseline", f"vanilla={vanilla.url}"]
        fixed = ["--max-tokens", "8", "--warmup", "1", "--out", str(out)]
        status, err = run_cli([*servers, *fixed, *args], capsys)
        assert status == 0, err
        return {"dcoco": spec.bodies, "vanilla": vanilla.bodies}


def test_a_run_compares_servers_on_the_same_prompts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    args = ["--suites", "code", "math", "--limit", "2", "--concurrency", "1,2"]
    args += ["--modes", "greedy,t1", "--slo", "ttft=1,tpot=1"]
    bodies = bench_pair(out, capsys, args)
    # Same calls with the same seeds for sampled modes; two streams at once arrive in either order.
    calls = {
        name: sorted(json.dumps([b["messages"], b.get("seed")]) for b in got[1:])
        for name, got in bodies.items()
    }
    assert calls["dcoco"] == calls["vanilla"]
    assert any(b.get("seed") for b in bodies["dcoco"])
    report = json.loads((out / "bench.json").read_text())
    assert report["reference"] == "vanilla"
    assert report["levels"] == ["c1", "c2"]
    assert set(report["suites"]) == {"code", "math"}
    c1 = {r["server"]: r for r in report["by_level"] if r["level"] == "c1" and r["mode"] == "t1"}
    assert c1["dcoco"]["requests"] == 4
    assert c1["dcoco"]["output_tokens"] == 4 * 6
    assert c1["dcoco"]["ratio"] > 1.5
    assert c1["vanilla"]["ratio"] == 1.0
    assert c1["dcoco"]["goodput"] > 0
    assert c1["dcoco"]["crosscheck"]["agree"] is True
    assert c1["dcoco"]["accepted_length"] == pytest.approx(1 + 4 * 4 / 8)
    assert c1["vanilla"]["accepted_length"] is None
    assert c1["dcoco"]["ratio_range"] is None  # one pass
    text = (out / "bench.md").read_text()
    assert "Speedup over `vanilla`" in text
    assert "| dcoco | greedy |" in text
    assert "Extended thinking was not varied" in text
    for plot in ("speedup-by-suite", "accepted-length-by-suite", "throughput"):
        assert (out / f"bench-{plot}.png").stat().st_size > 1000


def test_repeated_passes_give_each_ratio_its_spread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    args = ["--suites", "code", "--limit", "2", "--concurrency", "1", "--modes", "greedy"]
    bench_pair(out, capsys, [*args, "--repeats", "3"])
    report = json.loads((out / "bench.json").read_text())
    assert report["repeats"] == 3
    row = {r["server"]: r for r in report["by_level"]}
    assert row["dcoco"]["requests"] == 3 * 2  # each pass sends the level's requests again
    low, high = row["dcoco"]["ratio_range"]
    assert 1.5 < low <= row["dcoco"]["ratio"] <= high
    assert row["vanilla"]["ratio_range"] == [1.0, 1.0]
    assert "Over 3 passes" in (out / "bench.md").read_text()


def test_each_speculation_variant_goes_to_the_same_server(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "report"
    with ScriptedServer(Script(accepted=2, rejected=2)) as server:
        args = ["--url", server.url, "--speculation", "off,dflash,dcoco", "--out", str(out)]
        args += ["--suites", "code", "--limit", "2", "--concurrency", "1", "--modes", "greedy"]
        status, err = run_cli([*args, "--max-tokens", "8", "--warmup", "1"], capsys)
        assert status == 0, err
        asked = [body.get("speculation") for body in server.bodies]
    assert sorted(set(asked)) == ["dcoco", "dflash", "off"]
    counts = {m: asked.count(m) for m in ("off", "dflash", "dcoco")}
    assert len(set(counts.values())) == 1  # the same requests for each variant
    assert counts["off"] >= 1 + 2  # the warm-up, then at least the 2 prompts
    report = json.loads((out / "bench.json").read_text())
    assert report["reference"] == "off"
    assert {r["server"] for r in report["by_level"]} == {"off", "dflash", "dcoco"}
    status, err = run_cli(["--embedded", "dcoco", "--speculation", "off"], capsys)
    assert status == 1
    assert "--speculation sends variants to one --url server" in err


def test_the_counters_of_a_variant_are_its_methods() -> None:
    from dcoco.bench.scrape import parse_counters

    text = (
        'dcoco_spec_cycles_total{model="m",method="dcoco"} 10\n'
        'dcoco_spec_cycles_total{model="m",method="off"} 30\n'
        'dcoco_spec_draft_tokens_total{model="m",method="dcoco"} 40\n'
        'dcoco_spec_accepted_tokens_total{model="m",method="dcoco"} 25\n'
    )
    every = parse_counters(text)
    dcoco = parse_counters(text, "dcoco")
    off = parse_counters(text, "off")
    assert every is not None
    assert dcoco is not None
    assert off is not None
    assert (every.cycles, dcoco.cycles, off.cycles) == (40, 10, 30)
    assert (dcoco.drafted, dcoco.accepted, off.accepted) == (40, 25, 0)


def test_the_command_line_offers_what_the_modules_know() -> None:
    """The command module stays light, so it repeats these names."""
    from dcoco.bench import prompts, variants
    from dcoco.commands import bench
    from dcoco.suites import BENCH_SUITES

    assert bench.SUITES == BENCH_SUITES
    assert tuple(prompts.SAMPLING) == bench.MODES
    assert tuple(prompts.THINKING) == bench.THINKING
    assert tuple(variants.VARIANTS) == bench.VARIANTS
    assert get_args(Speculation) == bench.SPECULATION


def test_benchmarking_a_remote_server_loads_no_engine() -> None:
    """`dcoco bench --url` is a client: it runs where only the bench extra is installed."""
    code = (
        "import sys, dcoco.cli, dcoco.bench.main, dcoco.bench.variants; dcoco.cli.build_parser(); "
        "print(sorted(m for m in ('torch', 'dcoco.engine', 'dcoco.generate') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert result.stdout.strip() == "[]", result.stderr
