"""`dcoco gateway`: serve the OpenAI routes with uvicorn."""

import uvicorn

from dcoco.gateway.app import create_app
from dcoco.gateway.protocol import protocol_with_deadlines
from dcoco.gateway.services import Services
from dcoco.settings import GatewaySettings


def server_config(settings: GatewaySettings) -> uvicorn.Config:
    app = create_app(settings)
    services = app.state.services
    assert isinstance(services, Services)
    timeouts = services.metrics.client_timeouts
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,  # our JSON logging, configured by the caller
        access_log=False,  # the gateway logs each request itself, with its request id
        loop="uvloop",
        http=protocol_with_deadlines(
            settings.headers_timeout_s,
            settings.body_timeout_s,
            lambda phase: timeouts.labels(phase).inc(),
        ),
        timeout_keep_alive=settings.keepalive_timeout_s,
        timeout_graceful_shutdown=10,
    )


def run_gateway(settings: GatewaySettings) -> None:
    uvicorn.Server(server_config(settings)).run()
