"""Train an embedded model pair: the default (corpus, tokenizer, target, drafters) or SmolLM2's
drafters."""

import argparse
from pathlib import Path

from dcoco.commands.args import positive_int
from dcoco.paths import REPO_ROOT, SMOLLM2_MODELS, TINY_MODELS
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
        choices=["tiny", "smollm2", "smoke"],
        default="smollm2",
        help="smollm2: the default pair's drafters for SmolLM2-135M-Instruct (about 2 hours on 2 "
        "cores); tiny: the 4.2M pair from scratch (about 55 minutes); smoke: seconds, for tests",
    )
    train.add_argument(
        "--out",
        type=Path,
        help="where the exported models go; default: models/smollm2 or models/tiny",
    )
    train.add_argument(
        "--work",
        type=Path,
        help="stage outputs; a rerun resumes from the first stage that is not up to date; "
        "default: build/train-tiny or build/train-smollm2",
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


SHIPPED = {"tiny": TINY_MODELS, "smollm2": SMOLLM2_MODELS}


def run(args: argparse.Namespace) -> None:
    for name in ("out", "work"):
        if getattr(args, name) is None:
            if args.preset not in SHIPPED:  # never overwrite shipped models with a small run
                raise UsageError(f"--preset {args.preset} needs --out and --work")
            default = SHIPPED[args.preset] if name == "out" else None
            setattr(args, name, default or REPO_ROOT / "build" / f"train-{args.preset}")
    for name in ("out", "work"):
        path: Path = getattr(args, name)
        if path.exists() and not path.is_dir():
            raise UsageError(f"--{name} {path}: exists and is not a directory")
    from dcoco.train.cli import train

    train(args)
