"""The evaluation's outputs: a JSON file with every number, and markdown tables of it.

The goals section is computed from the numbers, the same way on every run; nothing in it is
written by hand.
"""

from dataclasses import asdict
from typing import Any

from dcoco.eval.runner import Measurement

GOAL_RATIO = 1.15  # DCOCO accepted length over DFlash's, on the code and math held-out splits
GOAL_CORRECT_SHARE = 0.05  # correction's share of the drafting cycle
GOAL_SPEEDUP = 2.0  # over vanilla greedy decoding, code, batch 1


def run_record(m: Measurement) -> dict[str, Any]:
    record = {k: v for k, v in asdict(m).items() if k != "token_ids"}
    record["tokens_per_s"] = round(m.tokens_per_s, 2)
    record["correct_share"] = round(m.correct_share, 4)
    record["accepted_length"] = round(m.accepted_length, 4)
    record["seconds"] = round(m.seconds, 3)
    record["speedup"] = round(m.speedup, 4) if m.speedup is not None else None
    record["acceptance_by_position"] = [round(x, 4) for x in m.acceptance_by_position]
    record["phase_seconds"] = {k: round(v, 4) for k, v in m.phase_seconds.items()}
    return record


def lookup(runs: list[Measurement]) -> dict[tuple[str, str, str], Measurement]:
    return {(m.setting, m.suite, m.variant): m for m in runs}


def goals(runs: list[Measurement]) -> dict[str, Any]:
    """The issue's four goals, read off the greedy batch-1 runs (correction share: all runs)."""
    table = lookup(runs)
    out: dict[str, Any] = {}
    ratios = {}
    for suite in ("code", "math"):
        dcoco, dflash = (
            table.get(("greedy-b1", suite, "dcoco-prefix")),
            table.get(("greedy-b1", suite, "dflash")),
        )
        if dcoco and dflash:
            ratios[suite] = round(dcoco.accepted_length / dflash.accepted_length, 4)
    out["dcoco_over_dflash_accepted_length"] = {
        "goal": GOAL_RATIO,
        "measured": ratios,
        "met": bool(ratios) and min(ratios.values()) >= GOAL_RATIO,
    }
    wins = {}
    for (setting, suite, variant), m in table.items():
        glob = table.get((setting, suite, "dcoco-global"))
        if variant == "dcoco-prefix" and setting == "greedy-b1" and glob:
            wins[suite] = round(m.accepted_length - glob.accepted_length, 4)
    out["prefix_minus_global_accepted_length"] = {
        "measured": wins,
        "met": bool(wins) and all(v > 0 for v in wins.values()),
    }
    shares = {
        f"{m.setting}/{m.suite}": round(m.correct_share, 4)
        for m in runs
        if m.variant == "dcoco-prefix"
    }
    out["correction_share_of_cycle"] = {
        "goal": GOAL_CORRECT_SHARE,
        "measured": shares,
        "met": bool(shares) and max(shares.values()) <= GOAL_CORRECT_SHARE,
    }
    code = {
        v: round(m.speedup, 4)
        for (s, suite, v), m in table.items()
        if s == "greedy-b1" and suite == "code" and m.speedup and v != "vanilla"
    }
    out["speedup_code_greedy_b1"] = {
        "goal": GOAL_SPEEDUP,
        "measured": code,
        "met": code.get("dcoco-prefix", 0.0) >= GOAL_SPEEDUP,
    }
    return out


def _cell(m: Measurement | None, what: str) -> str:
    if m is None:
        return "–"
    if what == "al":
        return f"{m.accepted_length:.2f}"
    if what == "tps":
        return f"{m.tokens_per_s:.0f} ({m.speedup:.2f}×)" if m.speedup else f"{m.tokens_per_s:.0f}"
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
    "| accepted length, top-1 | oracle |"
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
    """Teacher-forced accepted lengths: the top-1 draft's, and the oracle walk's ceiling."""
    lines = [COVERAGE_COLUMNS, "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
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
                c["teacher_forced_accepted_length_oracle"],
            ]
            lines.append(f"| {drafter} | {suite} | " + " | ".join(f"{x:.2f}" for x in cells) + " |")
    return lines


def markdown(results: dict[str, Any], runs: list[Measurement]) -> str:
    cfg = results["config"]
    suites = list(results["suites"])
    variants = cfg["variants"]
    out = [
        "# Evaluation results",
        "",
        f"Generated by `{cfg['command']}`. {cfg['limit']} prompts per suite (the first of each "
        f"set), at most {cfg['max_tokens']} new tokens, chat template, fp32, "
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
            f"## {setting}: tokens/s (speedup over vanilla)",
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
    share, speed = measured["correction_share_of_cycle"], measured["speedup_code_greedy_b1"]
    return [
        f"- DCOCO accepted length over DFlash's, code and math held-out, goal ≥ {ratio['goal']}×: "
        f"{verdict(ratio)} ({listing(ratio['measured'], '.3f')}).",
        f"- Prefix-first minus global accepted length, every suite, goal > 0: {verdict(rule)} "
        f"({listing(rule['measured'], '+.3f')}).",
        f"- Correction share of the cycle, every suite and setting, goal ≤ {share['goal']:.0%}: "
        f"{verdict(share)} (largest {max(share['measured'].values(), default=0.0):.1%}).",
        f"- Speedup over vanilla on code, goal ≥ {speed['goal']}× for dcoco-prefix: "
        f"{verdict(speed)} ({listing(speed['measured'], '.2f')}).",
    ]
