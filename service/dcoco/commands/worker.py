"""Run a worker: one engine consuming one model's request stream."""

import argparse
import sys

from dcoco.commands.args import settings_flags
from dcoco.shared.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    from dcoco.settings import (
        WorkerSettings,
    )  # the flags are the settings' (pydantic: not at import)

    settings_flags(parser, WorkerSettings)
    parser.add_argument(
        "--register-only",
        action="store_true",
        help="publish the model card and tokenizer from the target folder, then exit, without "
        "loading the engine: lets the gateway queue requests for a model with no worker yet",
    )


def run(args: argparse.Namespace) -> None:
    import uvloop

    from dcoco.checkpoint import CheckpointError
    from dcoco.logs import configure_logging
    from dcoco.queue.connection import UNAVAILABLE
    from dcoco.settings import WorkerSettings, settings_from
    from dcoco.tokenizer import TokenizerError
    from dcoco.worker.main import register_model, run_worker

    settings = settings_from(WorkerSettings, args)
    configure_logging(settings.log_level)
    try:
        if args.register_only:
            uvloop.run(register_model(settings))
            return
        status = uvloop.run(run_worker(settings))
    except (CheckpointError, TokenizerError, ValueError, OSError) as problem:
        raise UsageError(str(problem)) from None
    except UNAVAILABLE as problem:
        raise UsageError(f"Redis is unreachable: {problem}") from None
    if status:
        sys.exit(status)
