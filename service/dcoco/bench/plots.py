"""PNG plots of a benchmark report: speedup by suite and accepted length by suite (at the first
level of load, one panel per mode), and output throughput against the level of load for every
server compared. Each returns False, drawing nothing, when the report has nothing to show."""

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt


def _suite_bars(
    report: dict[str, Any], field: str, servers: list[str], ylabel: str, title: str, path: Path
) -> bool:
    level = report["levels"][0]
    rows = [r for r in report["by_suite"] if r["level"] == level and r[field] is not None]
    rows = [r for r in rows if r["server"] in servers]
    if not rows:
        return False
    modes = [m for m in report["modes"] if any(r["mode"] == m for r in rows)]
    suites = sorted({r["suite"] for r in rows})
    shown = [s for s in servers if any(r["server"] == s for r in rows)]
    width = 0.8 / len(shown)
    fig, axes = plt.subplots(
        len(modes), 1, figsize=(1.2 * len(suites) + 1.5, 3.4 * len(modes)), squeeze=False
    )
    for ax, mode in zip(axes[:, 0], modes, strict=True):
        for i, server in enumerate(shown):
            values = {
                r["suite"]: r[field] for r in rows if r["mode"] == mode and r["server"] == server
            }
            xs = [s + i * width for s in range(len(suites))]
            ax.bar(xs, [values.get(s, 0.0) for s in suites], width, label=server)
        ax.set_xticks([s + 0.4 - width / 2 for s in range(len(suites))], suites, fontsize=8)
        ax.set_title(f"{mode}, {level}")
        ax.set_ylabel(ylabel)
        if field == "ratio":
            ax.axhline(1.0, color="black", linewidth=0.8)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title)
    _save(fig, path)
    return True


def speedup_by_suite(report: dict[str, Any], path: Path) -> bool:
    reference = report["reference"]
    if reference is None:
        return False
    others = [s["name"] for s in report["servers"] if s["name"] != reference]
    label = f"per-stream tokens/s over {reference}"
    return _suite_bars(report, "ratio", others, label, "Speedup by suite", path)


def accepted_length_by_suite(report: dict[str, Any], path: Path) -> bool:
    servers = [s["name"] for s in report["servers"]]
    label = "tokens per cycle, bonus included"
    return _suite_bars(report, "accepted_length", servers, label, "Accepted length by suite", path)


def throughput_by_level(report: dict[str, Any], path: Path) -> bool:
    rows = [r for r in report["by_level"] if r["output_throughput"] is not None]
    if not rows:
        return False
    levels = report["levels"]
    modes = [m for m in report["modes"] if any(r["mode"] == m for r in rows)]
    fig, axes = plt.subplots(1, len(modes), figsize=(5 * len(modes), 3.8), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        for server in [s["name"] for s in report["servers"]]:
            values = {
                r["level"]: r["output_throughput"]
                for r in rows
                if r["mode"] == mode and r["server"] == server
            }
            xs = [i for i, level in enumerate(levels) if level in values]
            ax.plot(xs, [values[levels[i]] for i in xs], marker="o", label=server)
        ax.set_xticks(range(len(levels)), levels)
        ax.set_xlabel("load (cN: N concurrent streams, rN: N requests/s)")
        ax.set_ylabel("output tokens/s")
        ax.set_ylim(bottom=0)
        ax.set_title(mode)
        ax.legend(fontsize=7)
    fig.suptitle("Aggregate throughput by load")
    _save(fig, path)
    return True


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
