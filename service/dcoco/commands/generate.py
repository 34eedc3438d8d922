"""Generate text with the embedded engine."""

import argparse

from dcoco.commands.args import positive_int
from dcoco.shared.options import PRECISION_HELP, Mode, Precision, Rule


def configure(gen: argparse.ArgumentParser) -> None:
    gen.add_argument(
        "--target", help="Hugging Face Qwen3 folder; default: the embedded default model"
    )
    gen.add_argument(
        "--drafter",
        help="DFlash or DCOCO drafter folder (vLLM layout); default, when --target is not "
        "given either: the embedded default's drafter for --mode",
    )
    gen.add_argument("--mode", choices=[m.value for m in Mode], default=Mode.DCOCO.value)
    gen.add_argument("--rule", choices=[r.value for r in Rule], default=Rule.PREFIX.value)
    gen.add_argument("--gamma", type=float, default=0.5, help="the discounted rule's decay")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="one prompt")
    source.add_argument("--prompts", help='a JSONL file, one {"prompt": ...} per line')
    gen.add_argument("--max-tokens", type=positive_int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--chat", action="store_true", help="wrap each prompt as a user turn")
    gen.add_argument("--json", action="store_true", help="one JSON object per prompt")
    gen.add_argument(
        "--num-speculative-tokens", type=positive_int, help="B; default: the drafter's"
    )
    gen.add_argument("--top-k", type=positive_int, help="K; default: the corrector's")
    gen.add_argument(
        "--batch-size",
        dest="max_batch_size",
        type=positive_int,
        default=16,
        help="concurrent sequences",
    )
    gen.add_argument("--max-model-len", type=positive_int, help="default: the target's limit")
    gen.add_argument(
        "--precision",
        choices=[p.value for p in Precision],
        help=PRECISION_HELP,
    )


def run(args: argparse.Namespace) -> None:
    from dcoco.generate import run_generate
    from dcoco.paths import DEFAULT_DCOCO, DEFAULT_DFLASH, DEFAULT_TARGET

    if args.target is None:  # the embedded default pair, drafter included
        args.target = str(DEFAULT_TARGET)
        if args.drafter is None and args.mode != "vanilla":
            args.drafter = str(DEFAULT_DCOCO if args.mode == "dcoco" else DEFAULT_DFLASH)

    run_generate(args)
