"""The evaluation's outputs: a JSON file with every number, and markdown tables of it.

The goals section is computed from the numbers, the same way on every run; nothing in it is
written by hand.
"""

from dataclasses import asdict
from typing import Any

from dcoco.eval.runner import Measurement

GOAL_RATIO = 1.12  # DCOCO accepted length over DFlash's, every suite, greedy and T = 1
GOAL_LENGTH = {"humaneval": 2.0, "gsm8k": 2.0, "mtbench": 1.6}  # DCOCO accepted length
GOAL_TOP1_SLOT1 = 0.55  # DFlash's top-1 right at the first slot (mean over the suites)
GOAL_TOPK_LAST = 0.5  # the verifier's token in DFlash's top-K at the last slot (mean)
GOAL_CORRECT_SHARE = 0.03  # correction's share of the drafting cycle
GOAL_SETTING = "greedy-b1"
RATIO_SETTINGS = ("greedy-b1", "t1-b1")


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


def goals(runs: list[Measurement], coverage: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The goals, read off the batch-1 runs (greedy unless named) and DFlash's coverage:
    DCOCO's accepted length over DFlash's at T = 0 and T = 1, and on the goal suites;
    DFlash's coverage; DCOCO against n-gram lookup (the prefix-first walk's accepted length,
    the fastest DCOCO variant's tokens/s); prefix-first against global; correction's share.
    A goal whose runs were not asked for reads "not measured" and missed."""
    table = lookup(runs)
    suites = sorted({suite for _, suite, _ in table})

    def read(
        suite: str, variant: str, what: str = "accepted_length", setting: str = GOAL_SETTING
    ) -> float | None:
        m = table.get((setting, suite, variant))
        return None if m is None else float(getattr(m, what))

    def fastest_dcoco(suite: str) -> float | None:
        speeds = [
            m.tokens_per_s
            for (setting, at, variant), m in table.items()
            if (setting, at) == (GOAL_SETTING, suite) and variant.startswith("dcoco")
        ]
        return max(speeds, default=None)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    def difference(a: float | None, b: float | None) -> float | None:
        return a - b if a is not None and b is not None else None

    def per_suite(values: dict[str, float | None]) -> dict[str, float]:
        return {suite: round(v, 4) for suite, v in values.items() if v is not None}

    ratios = {
        setting: per_suite(
            {
                s: ratio(
                    read(s, "dcoco-prefix", setting=setting), read(s, "dflash", setting=setting)
                )
                for s in suites
            }
        )
        for setting in RATIO_SETTINGS
    }
    lengths = per_suite({s: read(s, "dcoco-prefix") for s in GOAL_LENGTH})
    drafted = coverage.get("dflash", {})
    slot1 = [c["top1_by_depth"][0] for c in drafted.values()]
    last = [c["topk_by_depth"][-1] for c in drafted.values()]
    ngram = {
        "accepted_length": per_suite(
            {s: ratio(read(s, "dcoco-prefix"), read(s, "ngram")) for s in suites}
        ),
        "tokens_per_s": per_suite(
            {s: ratio(fastest_dcoco(s), read(s, "ngram", "tokens_per_s")) for s in suites}
        ),
    }
    wins = per_suite(
        {s: difference(read(s, "dcoco-prefix"), read(s, "dcoco-global")) for s in suites}
    )
    shares = per_suite({s: read(s, "dcoco-prefix", "correct_share") for s in suites})
    return {
        "dcoco_over_dflash_accepted_length": {
            "goal": GOAL_RATIO,
            "measured": ratios,
            "met": all(r and min(r.values()) >= GOAL_RATIO for r in ratios.values()),
        },
        "dcoco_accepted_length": {
            "goal": GOAL_LENGTH,
            "measured": lengths,
            "met": len(lengths) == len(GOAL_LENGTH)
            and all(lengths[s] >= GOAL_LENGTH[s] for s in lengths),
        },
        "dflash_coverage": {
            "goal": {"top1_slot1": GOAL_TOP1_SLOT1, "topk_last_slot": GOAL_TOPK_LAST},
            "measured": {
                "top1_slot1": round(sum(slot1) / len(slot1), 4) if slot1 else None,
                "topk_last_slot": round(sum(last) / len(last), 4) if last else None,
            },
            "met": bool(slot1)
            and sum(slot1) / len(slot1) >= GOAL_TOP1_SLOT1
            and sum(last) / len(last) >= GOAL_TOPK_LAST,
        },
        "dcoco_over_ngram": {
            "measured": ngram,
            "met": all(r and min(r.values()) > 1.0 for r in ngram.values()),
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

    ratio, length = measured["dcoco_over_dflash_accepted_length"], measured["dcoco_accepted_length"]
    cover, ngram = measured["dflash_coverage"], measured["dcoco_over_ngram"]
    rule, share = (
        measured["prefix_minus_global_accepted_length"],
        measured["correction_share_of_cycle"],
    )
    ratios = "; ".join(
        f"{setting}: {listing(r, '.3f')}" for setting, r in ratio["measured"].items()
    )
    lengths = ", ".join(f"{s} ≥ {g}" for s, g in length["goal"].items())
    covered = cover["measured"]
    coverage = (
        f"top-1 at slot 1 {covered['top1_slot1']:.3f}, top-K at the last slot "
        f"{covered['topk_last_slot']:.3f}"
        if covered["top1_slot1"] is not None
        else "not measured"
    )
    return [
        f"- DCOCO accepted length over DFlash's, every suite, greedy and T = 1, goal ≥ "
        f"{ratio['goal']}×: {verdict(ratio)} ({ratios}).",
        f"- DCOCO accepted length, goal {lengths}: {verdict(length)} "
        f"({listing(length['measured'], '.2f')}).",
        f"- DFlash's coverage (mean over the suites), goal top-1 at slot 1 ≥ "
        f"{cover['goal']['top1_slot1']}, top-K at the last slot ≥ "
        f"{cover['goal']['topk_last_slot']}: {verdict(cover)} ({coverage}).",
        f"- DCOCO over n-gram lookup, every suite, goal > 1× in accepted length (prefix-first) "
        f"and tokens/s (the fastest DCOCO variant): {verdict(ngram)} (accepted length: "
        f"{listing(ngram['measured']['accepted_length'], '.2f')}; tokens/s: "
        f"{listing(ngram['measured']['tokens_per_s'], '.2f')}).",
        f"- Prefix-first minus global accepted length, every suite, goal > 0: {verdict(rule)} "
        f"({listing(rule['measured'], '+.3f')}).",
        f"- Correction share of the cycle, every suite, goal ≤ {share['goal']:.0%}: "
        f"{verdict(share)} ({listing(share['measured'], '.1%')}).",
    ]
