"""Start the embedded stack: private Redis, one torch worker, the gateway on 127.0.0.1:8000."""

import argparse
import sys


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--target", help="target folder (default: the embedded model)")
    parser.add_argument("--drafter", help="drafter folder (default: the embedded DCOCO drafter)")
    parser.add_argument("--mode", choices=["vanilla", "dflash", "dcoco"])
    parser.add_argument("--model-name", help="the model name clients ask for")


def run(args: argparse.Namespace) -> None:
    from dcoco.serve import serve

    names = {
        "target": "DCOCO_TARGET",
        "drafter": "DCOCO_DRAFTER",
        "mode": "DCOCO_MODE",
        "model_name": "DCOCO_MODEL_NAME",
    }
    worker_env = {
        env: str(getattr(args, flag)) for flag, env in names.items() if getattr(args, flag)
    }
    status = serve(args.host, args.port, worker_env)
    if status:
        sys.exit(status)
