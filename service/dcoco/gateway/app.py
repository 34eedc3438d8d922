"""The gateway application: `create_app(settings)` builds everything; nothing exists at import.

It never imports torch or vLLM: it tokenizes with the tokenizer workers publish, queues work in
Redis and relays events as OpenAI responses.
"""

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException

from dcoco.gateway.catalog import Catalog
from dcoco.gateway.errors import APIError, InvalidRequest, NotFound, Unavailable
from dcoco.gateway.guard import Guard
from dcoco.gateway.jobs import Jobs
from dcoco.gateway.lanes import Lanes
from dcoco.gateway.metrics import GatewayMetrics
from dcoco.gateway.middleware import ObserveRequests
from dcoco.gateway.playground import router as playground
from dcoco.gateway.routes import router
from dcoco.gateway.services import Services
from dcoco.queue.client import GatewayQueue
from dcoco.queue.connection import UNAVAILABLE, connect
from dcoco.settings import GatewaySettings
from dcoco.shared.supervisor import LoopFailed, Supervisor

log = logging.getLogger(__name__)
GAUGE_REFRESH_S = 2.0


def create_app(settings: GatewaySettings) -> FastAPI:
    api_keys = settings.load_api_keys()
    redis = connect(settings.redis_url, timeout_s=1.0)
    blocking = connect(settings.redis_url, timeout_s=GatewayQueue.BLOCK_S + 1.0)
    queue = GatewayQueue(redis, blocking)
    metrics = GatewayMetrics(CollectorRegistry())
    services = Services(
        settings=settings,
        queue=queue,
        catalog=Catalog(queue),
        guard=Guard(api_keys, redis, settings),
        jobs=Jobs(queue, settings, metrics),
        metrics=metrics,
        lanes=Lanes(
            settings.tokenizer_threads, settings.large_body_threads, settings.large_body_bytes
        ),
    )
    supervisor = Supervisor(on_restart=lambda loop: metrics.loop_restarts.labels(loop).inc())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        refresher = asyncio.create_task(_keep_refreshing(supervisor, services))
        yield
        refresher.cancel()
        await asyncio.gather(refresher, return_exceptions=True)
        await services.jobs.close()
        await queue.close()
        await redis.aclose()
        await blocking.aclose()

    app = FastAPI(title="DCOCO gateway", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.services = services
    app.include_router(router)
    app.include_router(playground)
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, _http_error)  # type: ignore[arg-type]
    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, _unavailable)
    app.add_exception_handler(Exception, _internal_error)
    app.add_middleware(ObserveRequests, metrics=metrics, log_prompts=settings.log_prompts)
    return app


async def _api_error(request: Request, error: APIError) -> Response:
    request.app.state.services.metrics.rejected.labels(error.code or error.type).inc()
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


async def _http_error(request: Request, error: HTTPException) -> Response:
    if error.status_code == 404:
        return await _api_error(request, NotFound(f"no route {request.method} {request.url.path}"))
    kind = APIError if error.status_code >= 500 else InvalidRequest
    body = kind(str(error.detail), code=f"http_{error.status_code}").body()
    return JSONResponse(body, status_code=error.status_code, headers=error.headers)


async def _internal_error(request: Request, error: Exception) -> Response:
    """Anything unexpected: logged with its traceback, answered in OpenAI's envelope."""
    log.error("unexpected error", exc_info=error)
    return await _api_error(request, APIError("internal error", code="internal_error"))


async def _unavailable(request: Request, error: Exception) -> Response:
    log.warning("Redis unavailable: %s", error)
    return await _api_error(request, Unavailable("the request queue is unavailable; retry shortly"))


async def _keep_refreshing(supervisor: Supervisor, services: Services) -> None:
    try:
        await supervisor.keep("gauges", lambda: _refresh_gauges(services))
    except LoopFailed:
        services.broken = True  # /healthz answers 503: the orchestrator restarts the gateway


async def _refresh_gauges(services: Services) -> None:
    """Keeps dcoco_queue_depth and dcoco_workers current for every published model, and logs
    when Redis becomes unreachable and when it answers again (what /readyz cannot say)."""
    unreachable = False
    while True:
        try:
            for card in await services.catalog.models():
                depth = await services.queue.depth(card.name)
                alive = await services.queue.live_workers(card.name, services.settings.lease_s)
                services.metrics.queue_depth.labels(card.name).set(depth)
                services.metrics.workers.labels(card.name).set(alive)
            if unreachable:
                log.info("Redis reachable again")
            unreachable = False
        except UNAVAILABLE as problem:  # refreshed again in GAUGE_REFRESH_S
            if not unreachable:
                log.warning("Redis unavailable; retrying", extra={"problem": str(problem)})
            unreachable = True
        await asyncio.sleep(GAUGE_REFRESH_S)
