"""Run one leg of the long drafter training run for SmolLM2 (resumable, across sessions)."""

import argparse
import json
from pathlib import Path

from dcoco.commands.args import positive_int
from dcoco.commands.train import positive_float
from dcoco.paths import REPO_ROOT
from dcoco.shared.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--hours",
        type=positive_float,
        default=3.0,
        help="this leg's wall-clock budget; its last 20%% refits the correctors (default 3)",
    )
    parser.add_argument(
        "--work",
        type=Path,
        default=REPO_ROOT / "build" / "train-run",
        help="data shards and the local checkpoint; a stopped leg resumes from it "
        "(default build/train-run)",
    )
    parser.add_argument("--threads", type=positive_int, help="torch threads; default 2")
    parser.add_argument(
        "--adopt",
        type=Path,
        nargs="+",
        default=[],
        metavar="SHARD",
        help="self-distilled shard files an earlier run of the same prompt stream wrote: they "
        "join this run as its next shards before the leg starts",
    )
    parser.add_argument(
        "--measure-sources",
        type=positive_float,
        metavar="SECONDS",
        help="instead of a leg: run each data source (teacher forcing with text and with argmax "
        "labels, self-distillation) for SECONDS and print its label tokens a second as JSON",
    )


def run(args: argparse.Namespace) -> None:
    from dataclasses import replace

    from dcoco.checkpoint import CheckpointError
    from dcoco.train.run import run_leg
    from dcoco.train.run_config import SMOLLM2_RUN

    cfg = replace(SMOLLM2_RUN, threads=args.threads or SMOLLM2_RUN.threads)
    if args.measure_sources:
        from dcoco.train.run_measure import measure_sources

        print(json.dumps(measure_sources(cfg, args.measure_sources), indent=2))
        return
    try:
        run_leg(cfg, args.work, args.hours, adopted=tuple(args.adopt))
    except (CheckpointError, OSError) as problem:
        raise UsageError(str(problem)) from None
