"""Start the embedded stack: private Redis, a torch worker per model, the gateway on
127.0.0.1:8000."""

import argparse
import sys

from dcoco.shared.options import Mode

EMBEDDED = ("smollm2", "tiny")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument(
        "--models",
        nargs="+",
        choices=EMBEDDED,
        default=list(EMBEDDED),
        help="embedded pairs to serve, one worker each (dcoco-smollm2, dcoco-tiny); ignored "
        "when a target is given (--target or DCOCO_TARGET)",
    )
    parser.add_argument("--target", help="target folder: one worker for it alone")
    parser.add_argument("--drafter", help="drafter folder for --target")
    parser.add_argument("--mode", choices=[m.value for m in Mode], help="DCOCO_MODE")
    parser.add_argument("--model-name", help="the model name clients ask for, with --target")


def run(args: argparse.Namespace) -> None:
    from dcoco.serve import embedded_workers, serve

    names = {
        "target": "DCOCO_TARGET",
        "drafter": "DCOCO_DRAFTER",
        "mode": "DCOCO_MODE",
        "model_name": "DCOCO_MODEL_NAME",
    }
    given = {env: str(getattr(args, flag)) for flag, env in names.items() if getattr(args, flag)}
    status = serve(args.host, args.port, embedded_workers(args.models, given))
    if status:
        sys.exit(status)
