"""The `dcoco` command.

Each subcommand lives in `dcoco.commands.<name>` with `configure(parser)` and `run(args)`.
Those modules stay light at import time (heavy imports happen inside `run`), so building the
parser never loads torch and `dcoco gateway` never does. Every user error is one line on stderr
and a non-zero exit, never a traceback.
"""

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import NoReturn

from dcoco.shared.errors import UsageError

COMMANDS = (
    "generate",
    "train",
    "train-run",
    "eval",
    "bench",
    "serve",
    "gateway",
    "worker",
    "convert",
    "export-drafter",
)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> Parser:
    parser = Parser(prog="dcoco", description="DCOCO speculative decoding")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"dcoco.commands.{name.replace('-', '_')}")
        sub = commands.add_parser(
            name, help=module.__doc__.splitlines()[0] if module.__doc__ else None
        )
        module.configure(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        importlib.import_module(f"dcoco.commands.{args.command.replace('-', '_')}").run(args)
    except UsageError as problem:
        print(f"dcoco {args.command}: error: {problem}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
