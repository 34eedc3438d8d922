"""Evaluate the default model pair: accepted length, tokens/s and coverage, in-process."""

import argparse
from pathlib import Path

from dcoco.commands.args import positive_int
from dcoco.paths import DEFAULT_MODELS, REPO_ROOT
from dcoco.shared.errors import UsageError
from dcoco.shared.options import DEFAULT_PRECISION, PRECISION_HELP, Precision

SUITES = ("code", "math", "prose", "humaneval", "gsm8k", "mtbench")
VARIANTS = (
    "vanilla",
    "ngram",
    "dflash",
    "dcoco-prefix",
    "dcoco-adaptive",
    "dcoco-lookup",
    "dcoco-global",
    "dcoco-discounted",
    "dcoco-frozen",
    "dcoco-top1",
    "vanilla-fp32",
    "vanilla-eager",
)
SETTINGS = ("greedy-b1", "greedy-b8", "greedy-b16", "t1-b1", "t1-b8", "t1-b16")


def configure(ev: argparse.ArgumentParser) -> None:
    ev.add_argument(
        "--models",
        type=Path,
        default=DEFAULT_MODELS,
        help="folder with target/, dflash/, dcoco/, dcoco-frozen/ and heldout/",
    )
    ev.add_argument("--suites", nargs="*", choices=SUITES, default=list(SUITES))
    ev.add_argument(
        "--prompts",
        type=Path,
        nargs="+",
        default=[],
        help='extra suites: JSONL files with one {"prompt": ...} per line',
    )
    ev.add_argument(
        "--variants",
        nargs="+",
        choices=VARIANTS,
        default=[v for v in VARIANTS if v not in ("vanilla-fp32", "vanilla-eager")],
        help="vanilla-fp32 is plain decoding in fp32, the faster plain decoding in some "
        "regimes; vanilla-eager is plain decoding without the compiled layers",
    )
    ev.add_argument(
        "--settings",
        nargs="+",
        choices=SETTINGS,
        default=["greedy-b1", "greedy-b8", "t1-b1", "t1-b8"],
    )
    ev.add_argument(
        "--precision",
        choices=[p.value for p in Precision],
        default=DEFAULT_PRECISION.value,
        help=PRECISION_HELP,
    )
    ev.add_argument("--max-model-len", type=positive_int, default=1024, help="context per sequence")
    ev.add_argument(
        "--limit",
        type=positive_int,
        default=24,  # with 128 tokens: about 20 minutes for everything on 2 cores
        help="prompts per suite (the first ones that fit)",
    )
    ev.add_argument("--max-tokens", type=positive_int, default=128)
    ev.add_argument("--threads", type=positive_int, default=2)
    ev.add_argument("--out", type=Path, default=REPO_ROOT / "docs", help="results folder")


def run(args: argparse.Namespace) -> None:
    if not args.suites and not args.prompts:
        raise UsageError("nothing to evaluate: name --suites or --prompts")
    if "vanilla" not in args.variants:
        raise UsageError("--variants must include vanilla, the baseline of every speedup")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    from dcoco.eval.cli import run_eval

    run_eval(args)
