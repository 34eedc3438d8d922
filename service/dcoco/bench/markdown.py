"""The markdown report of a benchmark run, from the dict `dcoco.bench.report.build` makes."""

from typing import Any

DEFINITIONS = (
    "Definitions, as `vllm bench serve` has them, all measured by the client: TTFT to the "
    "first content chunk; TPOT = (E2EL - TTFT) / (output tokens - 1); ITL per chunk between "
    "content chunks, and per token with each gap shared by the tokens of the chunk that closes "
    "it; E2EL to the end of the stream; output throughput = output tokens / wall time; goodput "
    "= requests meeting every SLO / wall time. Tokens are counted from `usage` only. Accepted "
    "length = 1 + B x accepted / (accepted + rejected), the bonus token included, with B the "
    "drafted tokens per cycle; the cross-check compares it with 1 + accepted / cycles from the "
    "server's counter deltas."
)


def _num(value: float | None, digits: int = 2) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ms(stats: dict[str, float] | None, q: str) -> str:
    return "—" if not stats else f"{stats[q] * 1000:.1f}"


def _speedup(row: dict[str, Any] | None) -> str:
    if row is None:
        return "—×"
    spread = row["ratio_range"]
    extra = "" if spread is None else f" [{spread[0]:.2f}, {spread[1]:.2f}]"
    return _num(row["ratio"]) + "×" + extra


def _ratio(value: float | None) -> str:
    return "" if value is None else f" ({value:.2f}×)"


def _table(header: list[str], rows: list[list[str]], text: int = 1) -> list[str]:
    """`text`: how many leading columns hold words (left-aligned); numbers align right."""
    rule = "|---" * text + "|---:" * (len(header) - text) + "|"
    lines = ["| " + " | ".join(header) + " |", rule]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def _servers(report: dict[str, Any]) -> list[str]:
    rows = [[s["name"], s["url"], f"`{s['model']}`", "measured"] for s in report["servers"]]
    rows += [[name, "", "", f"failed: {why}"] for name, why in report["failed"].items()]
    return _table(["server", "URL", "model", "status"], rows, text=4)


def _headline(report: dict[str, Any], servers: list[str]) -> list[str]:
    reference = report["reference"]
    if reference is None:
        return ["One server, no ratios."]
    cell = {(r["server"], r["mode"], r["level"]): r for r in report["by_level"]}
    rows = [
        [server, mode, *(_speedup(cell.get((server, mode, lv))) for lv in report["levels"])]
        for mode in report["modes"]
        for server in servers
        if server != reference
    ]
    word = "Speedup" if reference == "vanilla" else "Ratio"
    spread = (
        f" Over {report['repeats']} passes: the pooled ratio, with the lowest and highest pass "
        "in brackets."
        if report["repeats"] > 1
        else ""
    )
    return [
        f"{word} over `{reference}`: output throughput, same prompts, same run.{spread}",
        "",
        *_table(["server", "mode", *report["levels"]], rows, text=2),
    ]


def _throughput(report: dict[str, Any], servers: list[str]) -> list[str]:
    cell = {(r["server"], r["mode"], r["level"]): r for r in report["by_level"]}
    rows = []
    for mode in report["modes"]:
        for level in report["levels"]:
            row = [mode, level]
            for server in servers:
                r = cell.get((server, mode, level))
                row.append(
                    "—" if r is None else _num(r["output_throughput"], 1) + _ratio(r["ratio"])
                )
            rows.append(row)
    return _table(["mode", "load", *(f"{s} tok/s" for s in servers)], rows, text=2)


def _latency(report: dict[str, Any]) -> list[str]:
    rows = []
    for r in report["by_level"]:
        row = [r["server"], r["mode"], r["level"], f"{r['completed']}/{r['requests']}"]
        for field in ("ttft_s", "tpot_s", "itl_chunk_s", "itl_token_s", "e2el_s"):
            row += [_ms(r[field], "p50"), _ms(r[field], "p99")]
        row.append(_num(r["goodput"]))
        rows.append(row)
    header = ["server", "mode", "load", "done"]
    for name in ("TTFT", "TPOT", "ITL/chunk", "ITL/token", "E2EL"):
        header += [f"{name} p50", f"{name} p99"]
    return _table([*header, "goodput req/s"], rows, text=3)


def _suites(report: dict[str, Any], servers: list[str]) -> list[str]:
    level = report["levels"][0]
    cell = {
        (r["server"], r["mode"], r["suite"]): r for r in report["by_suite"] if r["level"] == level
    }
    suites = sorted({suite for _, _, suite in cell})
    rows = []
    for mode in report["modes"]:
        for suite in suites:
            row = [mode, suite]
            for server in servers:
                r = cell.get((server, mode, suite))
                if r is None:
                    row += ["—", "—"]
                    continue
                row.append(_num(r["per_stream_tokens_per_s"], 1) + _ratio(r["ratio"]))
                row.append(_num(r["accepted_length"]))
            rows.append(row)
    header = ["mode", "suite"]
    for server in servers:
        header += [f"{server} tok/s", f"{server} accepted"]
    return [
        f"At load {level}: per-stream tokens/s (ratio) and mean accepted length.",
        "",
        *_table(header, rows, text=2),
    ]


def _crosscheck(report: dict[str, Any]) -> list[str]:
    rows = []
    note = (
        "The counters count what the verifier accepted, as vLLM's do; `usage` counts a drafted "
        "token that a stop or max_tokens cut from the output as rejected, as OpenAI's predicted "
        "outputs do. Both count the same drafted tokens; they agree when those are equal and the "
        "cut tokens are at most B per request (B: the counters' draft slots)."
    )
    for r in report["by_level"]:
        c = r["crosscheck"]
        verdict = {None: "—", True: "agree", False: "DIFFER"}[c["agree"]]
        block = "—" if c["block"] is None else f"{c['block']:.2f} ({c['block_source']})"
        rows.append(
            [
                r["server"],
                r["mode"],
                r["level"],
                c["family"] or "—",
                block,
                _num(c["accepted_length_usage"]),
                _num(c["accepted_length_metrics"]),
                "—" if c["usage_drafted"] is None else str(c["usage_drafted"]),
                _num(c["metrics_drafted"], 0),
                _num(c["cut"], 0),
                verdict,
            ]
        )
    header = ["server", "mode", "load", "counters", "B", "accepted (usage)", "accepted (/metrics)"]
    header += ["drafted (usage)", "drafted (/metrics)", "cut by stops", "verdict"]
    return [note, "", *_table(header, rows, text=4)]


def summary(report: dict[str, Any]) -> str:
    """The headline and the throughput table, for the terminal."""
    servers = [s["name"] for s in report["servers"]]
    failed = [f"{name} failed: {why}" for name, why in report["failed"].items()]
    lines = [*failed, *_headline(report, servers), "", *_throughput(report, servers)]
    return "\n".join(lines) + "\n"


def markdown(report: dict[str, Any], plots: list[str]) -> str:
    servers = [s["name"] for s in report["servers"]]
    lines = [
        "# Serving benchmark",
        "",
        f"Generated by `{report['command']}` on {report['started']}.",
    ]
    lines += ["", report["setup"], "", *_servers(report), "", "## Headline", ""]
    lines += _headline(report, servers)
    lines += ["", "## Throughput by load", "", *_throughput(report, servers)]
    lines += ["", "## Latency (ms) and goodput", "", *_latency(report)]
    lines += ["", "## By suite", "", *_suites(report, servers)]
    lines += ["", "## Speculation cross-check", "", *_crosscheck(report)]
    errors = [
        (r["server"], r["mode"], r["level"], e) for r in report["by_level"] for e in r["errors"]
    ]
    if errors:
        lines += ["", "## Failed requests", ""]
        lines += [f"- {s} {m} {lv}: {count} × {message}" for s, m, lv, (message, count) in errors]
    lines += ["", "## Notes", "", f"- {DEFINITIONS}", *(f"- {note}" for note in report["notes"])]
    if plots:
        lines += ["", "## Plots", "", *(f"![{p}]({p})" for p in plots)]
    return "\n".join(lines) + "\n"
