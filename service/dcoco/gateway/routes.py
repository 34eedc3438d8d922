"""Thin routers: parse, check, hand over to the job layer, format."""

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Receive, Scope, Send

from dcoco.gateway.bodies import read_body, require_json
from dcoco.gateway.errors import Cancelled, InvalidRequest, Unavailable
from dcoco.gateway.formats import Format
from dcoco.gateway.prompts import budget, chat_prompt, completion_prompts
from dcoco.gateway.schemas import ChatRequest, CompletionRequest, parse
from dcoco.gateway.services import services_of
from dcoco.queue.connection import UNAVAILABLE
from dcoco.queue.protocol import GenerationParams
from dcoco.settings import GatewaySettings

router = APIRouter()
T = TypeVar("T")


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    return await _generate(request, chat=True)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    return await _generate(request, chat=False)


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    services = services_of(request)
    services.guard.authenticate(request.headers.get("authorization"))
    cards = await services.catalog.models()
    data = [
        {
            "id": c.name,
            "object": "model",
            "created": c.created,
            "owned_by": "dcoco",
            "max_model_len": c.max_model_len,
        }
        for c in cards
    ]
    return {"object": "list", "data": data}


@router.get("/healthz")
async def healthz(request: Request) -> dict[str, str]:
    if services_of(request).broken:
        raise Unavailable("a background loop kept crashing", code="broken")
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(request: Request) -> Response:
    """Ready when Redis answers and (unless DCOCO_READYZ_REQUIRES_WORKERS is off) at least one
    model has a live worker."""
    services = services_of(request)
    try:
        await services.queue.ping()
        cards = await services.catalog.models()
        alive = {
            c.name: await services.queue.live_workers(c.name, services.settings.lease_s)
            for c in cards
        }
    except UNAVAILABLE:
        raise Unavailable("Redis is unreachable") from None
    if services.settings.readyz_requires_workers and not any(alive.values()):
        raise Unavailable("no live worker for any model", code="no_workers")
    return JSONResponse({"status": "ready", "workers": alive})


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    return Response(
        generate_latest(services_of(request).metrics.registry), media_type=CONTENT_TYPE_LATEST
    )


async def _generate(request: Request, chat: bool) -> Response:
    """Authenticate, admit (rate and concurrency), then parse and queue. Limits come first, so
    malformed or hostile requests count against them too."""
    started = time.monotonic()
    services = services_of(request)
    principal = services.guard.authenticate(request.headers.get("authorization"))
    request.state.principal = principal
    release = await services.guard.admit(principal)
    streaming = False
    try:
        response = await _admitted(request, chat, started, release)
        streaming = isinstance(response, EventStream)
        return response
    finally:
        if not streaming:
            await _shielded(release)


async def _admitted(
    request: Request, chat: bool, started: float, release: Callable[[], Awaitable[None]]
) -> Response:
    services = services_of(request)
    require_json(request)
    raw = await read_body(request, services.settings.max_body_bytes)
    body: ChatRequest | CompletionRequest
    async with services.lanes.enter(request.state.principal, len(raw)) as lane:
        if chat:
            body = await lane.run(parse, ChatRequest, raw)
        else:
            body = await lane.run(parse, CompletionRequest, raw)
        _check_size(body, services.settings)
        model = await services.catalog.get(body.model)
        if isinstance(body, ChatRequest):
            prompts = await lane.run(chat_prompt, body, model)
        else:
            prompts = await lane.run(completion_prompts, body, model)
    params = GenerationParams(
        max_tokens=budget(prompts, body.budget(), model, "messages" if chat else "prompt"),
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stops(),
    )
    request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
    request.state.request_id = request_id
    fmt = Format(chat, request_id, int(time.time()), body.model, body.wants_usage_chunk())
    job = await services.jobs.submit(request_id, body.model, prompts, params, body.n, started)
    try:
        if body.stream:
            # Errors before the first keep-alive keep their HTTP status; later ones are events.
            keepalive = services.settings.sse_keepalive_s
            await _unless_disconnected(request, services.jobs.wait_started(job, keepalive))

            async def cleanup() -> None:
                if not job.finished:
                    services.jobs.abandon(job)
                await release()

            return EventStream(services.jobs.stream(job, fmt), cleanup)
        await _unless_disconnected(request, services.jobs.wait_started(job))
        choices = await _unless_disconnected(request, services.jobs.collect(job))
        return JSONResponse(fmt.response(choices, job.prompt_tokens))
    except BaseException:
        if not job.finished:
            services.jobs.abandon(job)
        raise


def _check_size(body: ChatRequest | CompletionRequest, settings: GatewaySettings) -> None:
    """Refuses what can never be accepted, before any tokenizing: more choices than allowed, or
    more generations (prompts × n) than the whole queue holds, which no retry would fix."""
    if body.n > settings.max_n:
        raise InvalidRequest(f"n must be at most {settings.max_n}", param="n")
    prompts = body.prompt_count()
    if prompts * body.n > settings.max_queue_depth:
        raise InvalidRequest(
            f"this request asks for {prompts * body.n} generations ({prompts} prompts × n = "
            f"{body.n}), more than the {settings.max_queue_depth} a model's queue holds",
            param="prompt" if prompts > 1 else "n",
        )


class EventStream(StreamingResponse):
    """Server-sent events whose cleanup runs however the response ends: finished, failed, or
    the client gone, even before the first chunk (when the body iterator never starts)."""

    def __init__(
        self, chunks: AsyncIterator[bytes], cleanup: Callable[[], Awaitable[None]]
    ) -> None:
        super().__init__(chunks, media_type="text/event-stream")
        self.cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await _shielded(self.cleanup)


async def _shielded(release: Callable[[], Awaitable[None]]) -> None:
    with anyio.CancelScope(shield=True), contextlib.suppress(*UNAVAILABLE):
        await release()  # if Redis is down, the slot's lease expires on its own


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Awaits `work`; if the client disconnects first, raises Cancelled (499)."""
    task = asyncio.ensure_future(work)
    disconnect = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({task, disconnect}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        disconnect.cancel()
    if not task.done():
        task.cancel()
        raise Cancelled("the client closed the connection")
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
