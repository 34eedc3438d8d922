"""Train the embedded default model pair: corpus, tokenizer, target, DFlash and DCOCO drafters."""

import argparse
from pathlib import Path

from dcoco.commands.args import positive_int
from dcoco.paths import DEFAULT_MODELS, REPO_ROOT
from dcoco.shared.errors import UsageError

STAGES = ("corpus", "tokenizer", "target", "distill", "dflash", "dcoco", "dcoco-frozen")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def configure(train: argparse.ArgumentParser) -> None:
    train.add_argument(
        "--preset",
        choices=["default", "smoke"],
        default="default",
        help="default: the shipped models (about 55 min on 2 cores); smoke: seconds, for tests",
    )
    train.add_argument(
        "--out",
        type=Path,
        help="where the exported models go; default (preset default only): models/default",
    )
    train.add_argument(
        "--work",
        type=Path,
        help="stage outputs; a rerun resumes from the first stage that is not up to date; "
        "default (preset default only): build/train-default",
    )
    train.add_argument(
        "--rerun", nargs="+", choices=STAGES, default=[], help="stages to run again anyway"
    )
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--threads", type=positive_int, help="torch threads; default: the preset's")
    train.add_argument(
        "--budget-scale",
        type=positive_float,
        default=1.0,
        help="multiply every stage's wall-clock budget by this",
    )


def run(args: argparse.Namespace) -> None:
    defaults = {"out": DEFAULT_MODELS, "work": REPO_ROOT / "build" / "train-default"}
    for name, default in defaults.items():
        if getattr(args, name) is None:
            if args.preset != "default":  # never overwrite the shipped models with a small run
                raise UsageError(f"--preset {args.preset} needs --out and --work")
            setattr(args, name, default)
    for name in ("out", "work"):
        path: Path = getattr(args, name)
        if path.exists() and not path.is_dir():
            raise UsageError(f"--{name} {path}: exists and is not a directory")
    from dcoco.train.cli import train

    train(args)
