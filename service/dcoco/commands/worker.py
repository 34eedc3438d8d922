"""Run a worker: one engine consuming one model's request stream."""

import argparse
import sys

from dcoco.commands.args import positive_int
from dcoco.shared.errors import UsageError
from dcoco.shared.options import PRECISION_HELP, Precision


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine",
        choices=["torch", "vllm", "instant"],
        help="DCOCO_ENGINE (vllm: AsyncLLM with the DCOCO plugin; instant: benchmark fixture)",
    )
    parser.add_argument("--model-name", help="the model name clients ask for (DCOCO_MODEL_NAME)")
    parser.add_argument("--target", help="target folder (DCOCO_TARGET)")
    parser.add_argument("--drafter", help="drafter folder (DCOCO_DRAFTER)")
    parser.add_argument("--mode", choices=["vanilla", "dflash", "dcoco"], help="DCOCO_MODE")
    parser.add_argument("--rule", choices=["prefix", "global", "discounted"], help="DCOCO_RULE")
    parser.add_argument("--max-batch-size", type=positive_int, help="DCOCO_MAX_BATCH_SIZE")
    parser.add_argument("--max-model-len", type=positive_int, help="DCOCO_MAX_MODEL_LEN")
    parser.add_argument(
        "--precision",
        choices=[p.value for p in Precision],
        help=f"DCOCO_PRECISION: {PRECISION_HELP}",
    )
    parser.add_argument("--metrics-port", type=int, help="DCOCO_METRICS_PORT (0: none)")
    parser.add_argument("--redis-url", help="DCOCO_REDIS_URL")
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
