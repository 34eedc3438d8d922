"""`dcoco gateway`: serve the OpenAI routes with uvicorn."""

import uvicorn
from fastapi import FastAPI

from dcoco.gateway.app import create_app
from dcoco.gateway.protocol import protocol_with_deadlines
from dcoco.gateway.services import Services
from dcoco.settings import GatewaySettings
from dcoco.shared.heap import FullCollections, freeze_startup_heap


def server_config(settings: GatewaySettings, app: FastAPI) -> uvicorn.Config:
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
    app = create_app(settings)
    config = server_config(settings, app)
    FullCollections(app.state.services.metrics.gc_full_collections.observe)
    freeze_startup_heap()
    uvicorn.Server(config).run()
