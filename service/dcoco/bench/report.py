"""The results of a run as one JSON-ready dict, then written out: `bench.json`, `bench.md` and
the PNG plots, into one folder.

Ratios compare each server with a reference: the server named `vanilla` when there is one
(the headline: speedup over plain decoding), else the first baseline. Per level the ratio is
of output throughput; per suite it is of per-stream tokens/s (at concurrency 1 the two are
the same), the speedup by suite the speculative-decoding literature reports. With several
passes (--repeats), each level's ratio also comes as the lowest and highest of its per-pass
values: the spread a single run cannot show.
"""

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from dcoco.bench.markdown import markdown
from dcoco.bench.metrics import Record, Slo, accepted_length, summarize
from dcoco.bench.plots import accepted_length_by_suite, speedup_by_suite, throughput_by_level
from dcoco.bench.run import Plan, Results
from dcoco.bench.scrape import crosscheck

THINKING_NOTE = (
    "Extended thinking was not varied. `--thinking both` sends "
    '`chat_template_kwargs: {"enable_thinking": true|false}`, the switch of Qwen3-style chat '
    "templates (vLLM accepts it); the chat templates of DCOCO's embedded models have no such "
    "switch, and DCOCO's gateway refuses the parameter."
)


def reference_of(names: list[str], baselines: list[str]) -> str | None:
    if "vanilla" in names:
        return "vanilla"
    return next((b for b in baselines if b in names), None)


def ratio(value: float | None, base: float | None) -> float | None:
    return value / base if value is not None and base else None


def build(
    results: Results,
    plan: Plan,
    context: dict[str, Any],
    slo: Slo,
    block: float | None,
    baselines: list[str],
) -> dict[str, Any]:
    """`context`: what the caller knows of the run (command, suites, machine, times)."""
    names = [s.name for s in results.servers]
    reference = reference_of(names, baselines)
    grouped: dict[tuple[str, str, str], list[Record]] = defaultdict(list)
    by_suite: dict[tuple[str, str, str, str], list[Record]] = defaultdict(list)
    for r in results.records:
        grouped[(r.server, r.mode, r.level)].append(r)
        by_suite[(r.server, r.mode, r.level, r.suite)].append(r)
    levels: list[dict[str, Any]] = []
    blocks: dict[tuple[str, str, str], float | None] = {}
    for key, records in grouped.items():
        row: dict[str, Any] = {"server": key[0], "mode": key[1], "level": key[2]}
        duration = sum(results.durations.get((key, k), 0.0) for k in range(plan.repeats))
        row |= summarize(records, duration, slo)
        row["unsent"] = results.unsent.get(key, 0)
        check = crosscheck(
            row["accepted_tokens"],
            row["rejected_tokens"],
            row["completed"],
            results.counters.get(key),
            block,
        )
        row["crosscheck"] = check
        blocks[key] = check["block"]
        row["accepted_length"] = check["accepted_length_usage"]
        levels.append(row)
    suites = []
    for (name, mode, level, suite), records in by_suite.items():
        row = {"server": name, "mode": mode, "level": level, "suite": suite}
        row |= summarize(records, 0.0, slo)
        row["accepted_length"] = (
            accepted_length(
                row["accepted_tokens"], row["rejected_tokens"], blocks[(name, mode, level)]
            )
            if row["accepted_tokens"] is not None
            else None
        )
        suites.append(row)
    order = {
        "server": {name: i for i, name in enumerate(names)},
        "mode": {m.name: i for i, m in enumerate(plan.modes)},
        "level": {load.name: i for i, load in enumerate(plan.loads)},
    }
    for rows in (levels, suites):
        rows.sort(
            key=lambda r: (
                order["mode"][r["mode"]],
                order["level"][r["level"]],
                r.get("suite", ""),
                order["server"][r["server"]],
            )
        )
    _add_ratios(levels, ["mode", "level"], "output_throughput", reference)
    _add_ratio_ranges(levels, results, slo, reference)
    _add_ratios(suites, ["mode", "level", "suite"], "per_stream_tokens_per_s", reference)
    notes = list(results.notes)
    notes += [
        f"{r['server']} {r['mode']} {r['level']}: {r['unsent']} requests not sent, the turn "
        "budget (--turn-budget) having run out"
        for r in levels
        if r["unsent"]
    ]
    if all(m.thinking is None for m in plan.modes):
        notes.append(THINKING_NOTE)
    for server in results.servers:
        if not results.continuous_usage.get(server.name):
            notes.append(
                f"{server.name}: streams no per-chunk usage, so its ITL per token is "
                "estimated (each chunk taken to carry its request's mean tokens per chunk)."
            )
    return context | {
        "servers": [
            {
                "name": s.name,
                "url": s.url,
                "model": s.model,
                "metrics_url": s.metrics_url,
                "per_chunk_usage": results.continuous_usage.get(s.name, False),
            }
            for s in results.servers
        ],
        "failed": results.failed,
        "reference": reference,
        "repeats": plan.repeats,
        "modes": [m.name for m in plan.modes],
        "levels": [load.name for load in plan.loads],
        "slo": {"ttft_s": slo.ttft, "tpot_s": slo.tpot, "e2el_s": slo.e2el},
        "block_size": block,
        "by_level": levels,
        "by_suite": suites,
        "notes": notes,
    }


def _add_ratios(
    rows: list[dict[str, Any]], keys: list[str], field: str, reference: str | None
) -> None:
    """Each row gets `ratio`: its `field` over the reference server's row of the same keys."""
    base = {tuple(row[k] for k in keys): row[field] for row in rows if row["server"] == reference}
    for row in rows:
        row["ratio"] = ratio(row[field], base.get(tuple(row[k] for k in keys)))


def _add_ratio_ranges(
    levels: list[dict[str, Any]], results: Results, slo: Slo, reference: str | None
) -> None:
    """Each level row gets `ratio_range`: [lowest, highest] of its ratio taken pass by pass,
    or None where there is a single pass or no reference."""
    by_pass: dict[tuple[str, str, str, int], list[Record]] = defaultdict(list)
    for r in results.records:
        by_pass[(r.server, r.mode, r.level, r.repeat)].append(r)
    passes = sorted({r.repeat for r in results.records})

    def throughput(key: tuple[str, str, str], repeat: int) -> float | None:
        records = by_pass.get((*key, repeat))
        duration = results.durations.get((key, repeat), 0.0)
        return summarize(records, duration, slo)["output_throughput"] if records else None

    for row in levels:
        row["ratio_range"] = None
        if reference is None or len(passes) < 2:
            continue
        mine = (row["server"], row["mode"], row["level"])
        base = (reference, row["mode"], row["level"])
        found = [ratio(throughput(mine, k), throughput(base, k)) for k in passes]
        values = [v for v in found if v is not None]
        if len(values) > 1:
            row["ratio_range"] = [min(values), max(values)]


def write(report: dict[str, Any], out: Path) -> list[Path]:
    """bench.json, bench.md and the plots; returns the paths written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "bench.json", out / "bench.md"]
    written[0].write_text(json.dumps(report, indent=2) + "\n")
    plots = {
        "bench-speedup-by-suite.png": speedup_by_suite,
        "bench-accepted-length-by-suite.png": accepted_length_by_suite,
        "bench-throughput.png": throughput_by_level,
    }
    drawn = []
    for name, draw in plots.items():
        if draw(report, out / name):
            written.append(out / name)
            drawn.append(name)
    written[1].write_text(markdown(report, drawn))
    return written
