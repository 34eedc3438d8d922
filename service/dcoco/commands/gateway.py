"""Serve the OpenAI-compatible gateway (no torch in this process)."""

import argparse

from dcoco.commands.args import settings_flags
from dcoco.shared.errors import UsageError


def configure(parser: argparse.ArgumentParser) -> None:
    from dcoco.settings import (
        GatewaySettings,
    )  # the flags are the settings' (pydantic: not at import)

    settings_flags(parser, GatewaySettings)


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
