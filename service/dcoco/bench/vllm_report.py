"""The tables of `make bench-vllm`: each server's figures against vLLM's plain server and
against each other, per mode and concurrency, with the goals the comparison is for."""

import statistics

from dcoco.bench.cpu import ROLES

Cell = dict[str, float]  # ttft_p50_ms, tokens_per_s, accepted_length, cpu_{role}_ms
Results = dict[str, dict[tuple[int, str, int], Cell]]  # server -> (pass, mode, c) -> cell
PLAIN, ADAPTIVE = "vllm-plain", "vllm-adaptive"
FRONT = "gateway+"  # our gateway in front of the vLLM server named after it
FIXED = ("vllm-plain", "vllm-dflash", "vllm-dcoco", "vllm-table")


def median(results: Results, server: str, mode: str, c: int, key: str) -> float | None:
    cells = results.get(server, {}).items()
    values = [v[key] for (_, m, cc), v in cells if m == mode and cc == c and key in v]
    return statistics.median(values) if values else None


def ratio_range(results: Results, server: str, base: str, mode: str, c: int) -> str:
    """The ratio of medians, with the lowest and highest pass's ratio when there are several."""
    mine, theirs = results.get(server, {}), results.get(base, {})
    passes = [
        mine[k]["tokens_per_s"] / theirs[k]["tokens_per_s"]
        for k in mine
        if k[1] == mode and k[2] == c and k in theirs and theirs[k]["tokens_per_s"]
    ]
    if not passes:
        return "n/m"
    middle = statistics.median(passes)
    return f"{middle:.2f}x" + (f" ({min(passes):.2f}-{max(passes):.2f})" if len(passes) > 1 else "")


def tables(results: Results, modes: list[str], levels: list[int], heading: str) -> str:
    lines = ["# The vLLM path side by side", "", heading, ""]
    for mode in modes:
        lines += [f"## {mode}: output tokens/s (against vLLM's plain server)", ""]
        lines += ["| server | " + " | ".join(f"c = {c}" for c in levels) + " |"]
        lines += ["|---|" + "---:|" * len(levels)]
        for server in results:
            cells = []
            for c in levels:
                rate = median(results, server, mode, c, "tokens_per_s")
                cells.append(
                    "n/m"
                    if rate is None
                    else f"{rate:.0f} ({ratio_range(results, server, PLAIN, mode, c)})"
                )
            lines.append(f"| {server} | " + " | ".join(cells) + " |")
        lines += ["", f"## {mode}: time to first token p50, ms; accepted length", ""]
        lines += ["| server | " + " | ".join(f"c = {c}" for c in levels) + " |"]
        lines += ["|---|" + "---:|" * len(levels)]
        for server in results:
            cells = []
            for c in levels:
                ttft = median(results, server, mode, c, "ttft_p50_ms")
                length = median(results, server, mode, c, "accepted_length")
                cells.append("n/m" if ttft is None else f"{ttft:.1f}; {length:.2f}")
            lines.append(f"| {server} | " + " | ".join(cells) + " |")
        lines += ["", *cpu_table(results, mode, levels)]
        lines += ["", *goals(results, mode, levels), ""]
    return "\n".join(lines) + "\n"


def cpu_table(results: Results, mode: str, levels: list[int]) -> list[str]:
    """CPU milliseconds per output token: engine processes / serving front / client."""
    lines = [
        f"## {mode}: CPU ms per output token: vLLM's engine processes / the serving front / "
        "the client",
        "",
        "| server | " + " | ".join(f"c = {c}" for c in levels) + " |",
        "|---|" + "---:|" * len(levels),
    ]
    for server in results:
        cells = []
        for c in levels:
            parts = [median(results, server, mode, c, f"cpu_{r}_ms") for r in ROLES]
            known = [p for p in parts if p is not None]
            cells.append(" / ".join(f"{p:.1f}" for p in known) if len(known) == 3 else "n/m")
        lines.append(f"| {server} | " + " | ".join(cells) + " |")
    return lines


def goals(results: Results, mode: str, levels: list[int]) -> list[str]:
    """Each goal, met or missed, per concurrency."""
    out = [f"Goals ({mode}):"]
    fronted = [(s, s.removeprefix(FRONT)) for s in results if s.startswith(FRONT)]
    for c in levels:
        for gateway, direct in fronted:
            ours, theirs = (median(results, s, mode, c, "ttft_p50_ms") for s in (gateway, direct))
            if ours is None or theirs is None:
                continue
            verdict = "met" if ours - theirs <= 5 else "missed"
            out.append(
                f"- c = {c}: our gateway's TTFT p50 {ours - theirs:+.1f} ms against vLLM's own "
                f"server, both {direct} (goal at most +5 ms: {verdict}); tokens/s "
                f"{ratio_range(results, gateway, direct, mode, c)} (goal at least 0.97x)"
            )
        best = max(
            FIXED,
            key=lambda s: median(results, s, mode, c, "tokens_per_s") or 0.0,
        )
        if median(results, ADAPTIVE, mode, c, "tokens_per_s") is not None:
            out.append(
                f"- c = {c}: adaptive DCOCO {ratio_range(results, ADAPTIVE, best, mode, c)} of "
                f"the best fixed policy ({best}), {ratio_range(results, ADAPTIVE, PLAIN, mode, c)} "
                "of plain (goals: at least the best; at least 1.1x plain at c = 1)"
            )
    return out
