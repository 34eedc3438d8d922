"""PNG plots of an evaluation: acceptance by position, coverage by depth, speedup by suite."""

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display

import matplotlib.pyplot as plt

from dcoco.eval.runner import Measurement


def acceptance_by_position(runs: list[Measurement], setting: str, path: Path) -> None:
    suites = sorted({m.suite for m in runs if m.setting == setting})
    cols = min(3, max(1, len(suites)))
    rows = -(-max(1, len(suites)) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.4 * cols, 3.0 * rows), squeeze=False)
    for ax, suite in zip(axes.flat, suites, strict=False):
        for m in runs:
            if m.setting == setting and m.suite == suite and m.acceptance_by_position:
                slots = range(1, len(m.acceptance_by_position) + 1)
                ax.plot(slots, m.acceptance_by_position, marker=".", label=m.variant)
        ax.set_title(suite)
        ax.set_xlabel("slot")
        ax.set_ylim(0, 1)
    for ax in axes.flat[len(suites) :]:
        ax.set_visible(False)
    for row in axes:
        row[0].set_ylabel("cycles accepting the slot")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=7)
    fig.suptitle(f"Acceptance by position ({setting})")
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    _save(fig, path)


def coverage_by_depth(
    coverage: dict[str, dict[str, dict[str, Any]]], drafter: str, path: Path
) -> None:
    suites = coverage.get(drafter, {})
    fig, ax = plt.subplots(figsize=(6, 4))
    for suite, c in suites.items():
        depth = range(1, len(c["top1_by_depth"]) + 1)
        (line,) = ax.plot(depth, c["topk_by_depth"], marker=".", label=f"{suite} top-{c['top_k']}")
        ax.plot(
            depth,
            c["top1_by_depth"],
            linestyle="--",
            color=line.get_color(),
            label=f"{suite} top-1",
        )
    ax.set_xlabel("slot depth")
    ax.set_ylabel("coverage of the verifier's token")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title(f"Coverage by depth ({drafter} drafter, greedy)")
    _save(fig, path)


def speedup_by_suite(runs: list[Measurement], setting: str, path: Path) -> None:
    chosen = [m for m in runs if m.setting == setting and m.variant != "vanilla" and m.speedup]
    suites = sorted({m.suite for m in chosen})
    variants = list(dict.fromkeys(m.variant for m in chosen))
    fig, ax = plt.subplots(figsize=(1.6 * max(1, len(suites)) + 2, 4))
    width = 0.8 / max(1, len(variants))
    for i, variant in enumerate(variants):
        values = {m.suite: m.speedup for m in chosen if m.variant == variant}
        xs = [s + i * width for s in range(len(suites))]
        ax.bar(xs, [values.get(s) or 0.0 for s in suites], width, label=variant)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylim(0, max([1.2] + [1.15 * (m.speedup or 0.0) for m in chosen]))
    ax.set_xticks([s + 0.4 - width / 2 for s in range(len(suites))], suites)
    ax.set_ylabel("tokens/s over vanilla")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3)
    ax.set_title(f"Speedup by suite ({setting})")
    _save(fig, path)


def _save(fig: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
