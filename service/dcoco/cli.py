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
from typing import TYPE_CHECKING, NoReturn, TypeVar

if TYPE_CHECKING:
    from pydantic_settings import BaseSettings

S = TypeVar("S", bound="BaseSettings")

COMMANDS = ("generate", "train", "eval", "serve", "gateway", "worker")


class UsageError(Exception):
    """A problem with the user's input; printed as one line, exit status 1."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def settings_from(cls: type[S], args: argparse.Namespace) -> S:
    """Settings from DCOCO_* variables, overridden by the flags the user gave."""
    from pydantic import ValidationError

    overrides = {k: v for k, v in vars(args).items() if k in cls.model_fields and v is not None}
    try:
        return cls(**overrides)
    except ValidationError as problem:
        error = problem.errors()[0]
        raise UsageError(f"{'.'.join(str(p) for p in error['loc'])}: {error['msg']}") from None


def build_parser() -> Parser:
    parser = Parser(prog="dcoco", description="DCOCO speculative decoding")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    for name in COMMANDS:
        module = importlib.import_module(f"dcoco.commands.{name}")
        sub = commands.add_parser(
            name, help=module.__doc__.splitlines()[0] if module.__doc__ else None
        )
        module.configure(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        importlib.import_module(f"dcoco.commands.{args.command}").run(args)
    except UsageError as problem:
        print(f"dcoco {args.command}: error: {problem}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
