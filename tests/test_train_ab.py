"""The A/B instruments: teacher-forced figures from fixed greedy completions agree with the
evaluation's coverage table, and an arm's summary reads a `dcoco eval` results file."""

import subprocess
import sys
from pathlib import Path

import pytest

from dcoco.checkpoint import load_drafter, load_target
from dcoco.eval.coverage import measure_coverage
from dcoco.eval.paired import arm_coverage, arm_expected, completions
from dcoco.paths import TINY_DCOCO, TINY_DFLASH, TINY_HELDOUT, TINY_TARGET
from dcoco.shared.options import Rule
from dcoco.train.run_ab import summary

pytestmark = pytest.mark.slow


def test_teacher_forced_figures_match_the_evaluations_coverage() -> None:
    pairs = completions(TINY_TARGET, TINY_HELDOUT, limit=2, max_tokens=24)
    assert set(pairs) == {"code", "math", "prose", "humaneval", "gsm8k", "mtbench"}
    assert all(len(p) == 2 and all(c for _, c in p) for p in pairs.values())
    figures = arm_coverage(TINY_TARGET, TINY_DFLASH, pairs, 16)
    target = load_target(TINY_TARGET)
    drafter = load_drafter(TINY_DFLASH)
    for name, suite in pairs.items():
        expected = measure_coverage(target, drafter, suite, 16).summary()
        assert figures["accepted_length"][name] == pytest.approx(
            expected["teacher_forced_accepted_length_top1"], abs=0.05
        )  # bf16 here, fp32 there
    block = drafter.config.block_size
    assert len(figures["top1_by_depth"]) == block
    assert 1.0 <= figures["mean_accepted_length"] <= figures["oracle_walk"] <= block + 1
    assert figures["top1_slot1"] <= figures["topk_slot1"]
    assert figures["walk_accepted_length"] == {}  # no corrector
    dcoco = arm_coverage(TINY_TARGET, TINY_DCOCO, pairs, 16, tuple(Rule))
    assert set(dcoco["walk_accepted_length"]) == {r.value for r in Rule}
    for rule, walk in dcoco["walk_accepted_length"].items():
        assert set(walk) == set(pairs)
        assert 1.0 <= dcoco["mean_walk_accepted_length"][rule] <= dcoco["oracle_walk"]


def test_sampled_completions_give_expected_lengths_per_draft() -> None:
    pairs = completions(TINY_TARGET, TINY_HELDOUT, limit=2, max_tokens=24, temperature=1.0)
    again = completions(TINY_TARGET, TINY_HELDOUT, limit=2, max_tokens=24, temperature=1.0)
    assert pairs == again  # seeded
    assert pairs != completions(TINY_TARGET, TINY_HELDOUT, limit=2, max_tokens=24)
    figures = arm_expected(TINY_TARGET, TINY_DCOCO, pairs, 16, 1.0, (Rule.PREFIX,))
    assert set(figures["expected_accepted_length"]) == {"top1", "prefix"}
    for draft, mean in figures["mean"].items():
        assert set(figures["expected_accepted_length"][draft]) == set(pairs)
        assert 1.0 <= mean <= 16.0


def test_an_arms_summary_reads_the_eval_results() -> None:
    def coverage(top1: float, accepted: float) -> dict[str, object]:
        return {
            "top1_by_depth": [top1, 0.1],
            "topk_by_depth": [0.9, 0.5],
            "teacher_forced_accepted_length_top1": accepted,
            "teacher_forced_accepted_length_oracle": 3.0,
        }

    results = {
        "runs": [
            {"suite": "code", "variant": "dflash", "setting": "greedy-b1", "accepted_length": 2.0},
            {"suite": "math", "variant": "dflash", "setting": "greedy-b1", "accepted_length": 3.0},
            {"suite": "math", "variant": "dflash", "setting": "t1-b1", "accepted_length": 9.0},
            {"suite": "math", "variant": "vanilla", "setting": "greedy-b1", "accepted_length": 1},
        ],
        "coverage": {"dflash": {"code": coverage(0.4, 1.5), "math": coverage(0.6, 2.5)}},
    }
    got = summary("arm", results)
    assert got["accepted_length"] == {"code": 2.0, "math": 3.0}
    assert got["mean_accepted_length"] == 2.5
    assert got["top1_slot1"] == 0.5
    assert got["top1_slot15"] == 0.1
    assert got["teacher_forced_accepted_length"] == 2.0


def test_a_negative_temperature_is_one_line(tmp_path: Path) -> None:
    args = [sys.executable, "-m", "dcoco.eval.paired", "a=b", "--temperature", "-1"]
    args += ["--completions", str(tmp_path / "none.json")]
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    assert done.returncode == 2
    assert done.stderr.strip().endswith("--temperature must be in [0, 100], got -1.0")
    assert not (tmp_path / "none.json").exists()  # refused before any work
