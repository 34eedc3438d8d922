"""Write a drafter folder that vLLM loads with method dflash (DCOCO or plain DFlash)."""

import argparse
from pathlib import Path

from dcoco.commands.args import positive_int
from dcoco.shared.errors import UsageError
from dcoco.shared.options import Rule


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--drafter", required=True, help="source drafter folder (ours or vLLM's)")
    parser.add_argument("--out", required=True, help="folder to write")
    parser.add_argument(
        "--format",
        choices=["dcoco", "dflash"],
        default="dcoco",
        help="dcoco: DCOCODraftModel with its corrector (needs this package's vLLM plugin); "
        "dflash: the same drafter without the corrector, for stock vLLM",
    )
    parser.add_argument("--top-k", type=positive_int, help="K vLLM keeps; default: the trained K")
    parser.add_argument("--rule", choices=[r.value for r in Rule], default=Rule.PREFIX.value)
    parser.add_argument("--gamma", type=float, default=0.5, help="the discounted rule's decay")
    parser.add_argument("--force", action="store_true", help="replace a non-empty --out")


def run(args: argparse.Namespace) -> None:
    from dcoco.checkpoint import CheckpointError
    from dcoco.vllm.export import ExportOptions, export_drafter

    try:
        options = ExportOptions(args.format, args.top_k, Rule(args.rule), args.gamma)
        export_drafter(Path(args.drafter), Path(args.out), options, overwrite=args.force)
    except (CheckpointError, ValueError, OSError) as problem:
        raise UsageError(str(problem)) from None
    print(f"wrote {args.out} ({args.format})")
