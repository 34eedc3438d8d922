"""The evaluation's outputs: a JSON file with every number, and markdown tables of it.

The goals section is computed from the numbers, the same way on every run; nothing in it is
written by hand.
"""

from dataclasses import asdict
from typing import Any

from dcoco.eval.runner import Measurement

GOAL_RATIO = 1.15  # DCOCO accepted length over DFlash's, every suite
GOAL_CORRECT_SHARE = 0.03  # correction's share of the drafting cycle
GOAL_SPEEDUP = 2.0  # DCOCO over plain decoding on HumanEval and GSM8K (and > 1 on MT-Bench)
SPEEDUP_SUITES = {"humaneval": GOAL_SPEEDUP, "gsm8k": GOAL_SPEEDUP, "mtbench": 1.0}
GOAL_SETTING = "greedy-b1"


def run_record(m: Measurement) -> dict[str, Any]:
    record = {k: v for k, v in asdict(m).items() if k != "token_ids"}
    record["tokens_per_s"] = round(m.tokens_per_s, 2)
    record["correct_share"] = round(m.correct_share, 4)
    record["accepted_length"] = round(m.accepted_length, 4)
    record["seconds"] = round(m.seconds, 3)
    record["speedup"] = round(m.speedup, 4) if m.speedup is not None else None
    fastest = m.speedup_over_fastest
    record["speedup_over_fastest"] = round(fastest, 4) if fastest is not None else None
    record["acceptance_by_position"] = [round(x, 4) for x in m.acceptance_by_position]
    record["phase_seconds"] = {k: round(v, 4) for k, v in m.phase_seconds.items()}
    return record


def lookup(runs: list[Measurement]) -> dict[tuple[str, str, str], Measurement]:
    return {(m.setting, m.suite, m.variant): m for m in runs}


def goals(runs: list[Measurement]) -> dict[str, Any]:
    """The goals, read off the greedy batch-1 runs: accepted length over DFlash's on every
    suite, prefix-first against global, correction's share, and DCOCO's speedup over the same
    precision's plain decoding and over the fastest plain decoding measured."""
    table = lookup(runs)
    at = {(suite, v): m for (setting, suite, v), m in table.items() if setting == GOAL_SETTING}
    suites = sorted({suite for suite, _ in at})
    ratios = {
        suite: round(
            at[(suite, "dcoco-prefix")].accepted_length / at[(suite, "dflash")].accepted_length, 4
        )
        for suite in suites
        if (suite, "dcoco-prefix") in at and (suite, "dflash") in at
    }
    wins = {
        suite: round(
            at[(suite, "dcoco-prefix")].accepted_length
            - at[(suite, "dcoco-global")].accepted_length,
            4,
        )
        for suite in suites
        if (suite, "dcoco-prefix") in at and (suite, "dcoco-global") in at
    }
    shares = {
        suite: round(at[(suite, "dcoco-prefix")].correct_share, 4)
        for suite in suites
        if (suite, "dcoco-prefix") in at
    }
    speed = {
        suite: round(at[(suite, "dcoco-prefix")].speedup or 0.0, 4)
        for suite in SPEEDUP_SUITES
        if (suite, "dcoco-prefix") in at
    }
    fastest = {
        suite: round(at[(suite, "dcoco-prefix")].speedup_over_fastest or 0.0, 4)
        for suite in SPEEDUP_SUITES
        if (suite, "dcoco-prefix") in at
    }
    return {
        "dcoco_over_dflash_accepted_length": {
            "goal": GOAL_RATIO,
            "measured": ratios,
            "met": bool(ratios) and min(ratios.values()) >= GOAL_RATIO,
        },
        "prefix_minus_global_accepted_length": {
            "measured": wins,
            "met": bool(wins) and all(v > 0 for v in wins.values()),
        },
        "correction_share_of_cycle": {
            "goal": GOAL_CORRECT_SHARE,
            "measured": shares,
            "met": bool(shares) and max(shares.values()) <= GOAL_CORRECT_SHARE,
        },
        "speedup": {
            "goal": SPEEDUP_SUITES,
            "measured": speed,
            "over_fastest_plain": fastest,
            "met": bool(speed) and all(speed[s] >= SPEEDUP_SUITES[s] for s in speed),
        },
    }


def _cell(m: Measurement | None, what: str) -> str:
    if m is None:
        return "–"
    if what == "al":
        return f"{m.accepted_length:.2f}"
    if what == "tps":
        if not m.speedup:
            return f"{m.tokens_per_s:.0f}"
        fastest = m.speedup_over_fastest
        other = f"; {fastest:.2f}× fastest" if fastest and abs(fastest - m.speedup) > 5e-3 else ""
        return f"{m.tokens_per_s:.0f} ({m.speedup:.2f}×{other})"
    return f"{m.correct_share:.1%}"


def table(
    runs: list[Measurement], setting: str, what: str, variants: list[str], suites: list[str]
) -> list[str]:
    rows = lookup(runs)
    lines = ["| variant | " + " | ".join(suites) + " |", "|---|" + "---:|" * len(suites)]
    for variant in variants:
        cells = [_cell(rows.get((setting, suite, variant)), what) for suite in suites]
        if any(c != "–" for c in cells):
            lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines


def share_table(runs: list[Measurement], settings: list[str], suites: list[str]) -> list[str]:
    rows = lookup(runs)
    lines = ["| setting | " + " | ".join(suites) + " |", "|---|" + "---:|" * len(suites)]
    for setting in settings:
        cells = [_cell(rows.get((setting, suite, "dcoco-prefix")), "share") for suite in suites]
        lines.append(f"| {setting} | " + " | ".join(cells) + " |")
    return lines


COVERAGE_COLUMNS = (
    "| drafter | suite | top-1 @1 | top-1 @B | top-K @1 | top-K @B | top-K where top-1 wrong "
    "| accepted length, top-1 | accepted length, prefix-first walk | oracle |"
)


def rescue_table(runs: list[Measurement], cfg: dict[str, Any]) -> list[str]:
    """Drafted tokens where the walk left the top-1, and how many of those were accepted."""
    lines = [
        "| setting | suite | drafted tokens corrected | corrected tokens accepted |",
        "|---|---|---:|---:|",
    ]
    for m in runs:
        if m.variant == "dcoco-prefix" and m.verifications:
            drafted = m.verifications * cfg["block_size"]
            rescued = (
                m.corrected_accepted_tokens / m.corrected_tokens if m.corrected_tokens else 0.0
            )
            lines.append(
                f"| {m.setting} | {m.suite} | {m.corrected_tokens / drafted:.1%} | {rescued:.1%} |"
            )
    return lines


def coverage_table(coverage: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    """Teacher-forced accepted lengths: the top-1 draft's, the corrector's prefix-first walk's
    (a drafter with a corrector; "-" otherwise), and the oracle walk's ceiling."""
    lines = [COVERAGE_COLUMNS, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for drafter, suites in coverage.items():
        for suite, c in suites.items():
            t1, tk = c["top1_by_depth"], c["topk_by_depth"]
            cells = [
                t1[0],
                t1[-1],
                tk[0],
                tk[-1],
                c["topk_given_top1_wrong"],
                c["teacher_forced_accepted_length_top1"],
                c.get("teacher_forced_accepted_length_prefix"),
                c["teacher_forced_accepted_length_oracle"],
            ]
            shown = ["-" if x is None else f"{x:.2f}" for x in cells]
            lines.append(f"| {drafter} | {suite} | " + " | ".join(shown) + " |")
    return lines


def markdown(results: dict[str, Any], runs: list[Measurement]) -> str:
    cfg = results["config"]
    suites = list(results["suites"])
    variants = cfg["variants"]
    out = [
        "# Evaluation results",
        "",
        f"Generated by `{cfg['command']}`. {cfg['limit']} prompts per suite (the first of each "
        f"set), at most {cfg['max_tokens']} new tokens, chat template, {cfg['precision']}, "
        f"{cfg['threads']} threads; K = {cfg['top_k']}, B = {cfg['block_size']}. "
        "Accepted length counts the bonus token.",
        "",
    ]
    for setting in cfg["settings"]:
        out += [
            f"## {setting}: accepted length",
            "",
            *table(runs, setting, "al", variants, suites),
            "",
        ]
        out += [
            f"## {setting}: tokens/s (speedup over vanilla; over the fastest plain decoding "
            "when that is vanilla-fp32)",
            "",
            *table(runs, setting, "tps", variants, suites),
            "",
        ]
    out += ["## What the corrector changed (dcoco-prefix)", "", *rescue_table(runs, cfg), ""]
    out += ["## Correction share of the cycle (dcoco-prefix)", ""]
    out += share_table(runs, cfg["settings"], suites)
    out += [
        "",
        f"## Top-K coverage (K = {cfg['top_k']}), greedy completions",
        "",
        *coverage_table(results["coverage"]),
        "",
    ]
    out += ["## Goals (greedy, batch 1 unless stated)", "", *goal_lines(results["goals"])]
    return "\n".join(out) + "\n"


def goal_lines(measured: dict[str, Any]) -> list[str]:
    def verdict(goal: dict[str, Any]) -> str:
        return "met" if goal["met"] else "missed"

    def listing(values: dict[str, float], fmt: str) -> str:
        return ", ".join(f"{k} {format(v, fmt)}" for k, v in values.items()) or "not measured"

    ratio, rule = (
        measured["dcoco_over_dflash_accepted_length"],
        measured["prefix_minus_global_accepted_length"],
    )
    share, speed = measured["correction_share_of_cycle"], measured["speedup"]
    targets = ", ".join(f"{s} ≥ {g}×" if g > 1 else f"{s} > 1×" for s, g in speed["goal"].items())
    return [
        f"- DCOCO accepted length over DFlash's, every suite, goal ≥ {ratio['goal']}×: "
        f"{verdict(ratio)} ({listing(ratio['measured'], '.3f')}).",
        f"- Prefix-first minus global accepted length, every suite, goal > 0: {verdict(rule)} "
        f"({listing(rule['measured'], '+.3f')}).",
        f"- Correction share of the cycle, every suite, goal ≤ {share['goal']:.0%}: "
        f"{verdict(share)} ({listing(share['measured'], '.1%')}).",
        f"- DCOCO speedup over plain decoding in the same precision, goal {targets}: "
        f"{verdict(speed)} ({listing(speed['measured'], '.2f')}); over the fastest plain "
        f"decoding measured: {listing(speed['over_fastest_plain'], '.2f')}.",
    ]
