"""Serve the OpenAI-compatible gateway (no torch in this process)."""

import argparse

from dcoco.shared.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", help="bind address (DCOCO_HOST)")
    parser.add_argument("--port", type=int, help="port (DCOCO_PORT)")
    parser.add_argument("--redis-url", help="DCOCO_REDIS_URL")


def run(args: argparse.Namespace) -> None:
    from dcoco.gateway.main import run_gateway
    from dcoco.logs import configure_logging
    from dcoco.settings import GatewaySettings, settings_from

    settings = settings_from(GatewaySettings, args)
    try:
        settings.load_api_keys()
    except ValueError as problem:
        raise UsageError(str(problem)) from None
    configure_logging(settings.log_level)
    run_gateway(settings)
