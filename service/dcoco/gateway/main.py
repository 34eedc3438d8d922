"""`dcoco gateway`: serve the OpenAI routes with uvicorn."""

import uvicorn

from dcoco.gateway.app import create_app
from dcoco.settings import GatewaySettings


def run_gateway(settings: GatewaySettings) -> None:
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_config=None,  # our JSON logging, configured by the caller
        access_log=False,  # the gateway logs each request itself, with its request id
        loop="uvloop",
        http="httptools",
        timeout_graceful_shutdown=10,
    )
