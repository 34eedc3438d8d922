"""Thin routers: parse, check, hand over to the job layer, answer.

The generation routes read their own bodies, after the caller is authenticated and admitted
(`deps.py`), so that limits come first and malformed or hostile requests count against them
too; bodies are parsed and tokenized on a lane's threads, off the event loop (`lanes.py`).
"""

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import APIRouter, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.types import Receive, Scope, Send

from dcoco.gateway import docs
from dcoco.gateway.answers import Answer
from dcoco.gateway.bodies import read_body, require_json
from dcoco.gateway.catalog import ServedModel
from dcoco.gateway.deps import Admitted, Caller, ServicesDep
from dcoco.gateway.errors import Cancelled, InvalidRequest, Unavailable, UnsupportedValue
from dcoco.gateway.pieces import Pieces
from dcoco.gateway.prompts import budget, chat_prompt, completion_prompts
from dcoco.gateway.replies import (
    ChatCompletion,
    ChatCompletionEvent,
    Health,
    ModelEntry,
    ModelList,
    Readiness,
    TextCompletion,
    TextCompletionEvent,
    dump,
)
from dcoco.gateway.schemas import ChatRequest, CompletionRequest, Sampling, parse
from dcoco.gateway.services import Services
from dcoco.queue.connection import UNAVAILABLE
from dcoco.queue.protocol import GenerationParams
from dcoco.settings import GatewaySettings

router = APIRouter()
T = TypeVar("T")
JSON = "application/json"


@dataclass(frozen=True)
class Route:
    chat: bool
    request: type[Sampling]
    prompts: Callable[..., list[list[int]]]  # (request, model) -> prompt token ids
    id_prefix: str
    prompt_param: str


CHAT = Route(True, ChatRequest, chat_prompt, "chatcmpl-", "messages")
COMPLETION = Route(False, CompletionRequest, completion_prompts, "cmpl-", "prompt")


@router.post(
    "/v1/chat/completions", **docs.generation(ChatRequest, ChatCompletion, ChatCompletionEvent)
)
async def chat_completions(request: Request, app: ServicesDep, admitted: Admitted) -> Response:
    return await _generate(request, app, admitted.principal, admitted.started_at, CHAT)


@router.post(
    "/v1/completions", **docs.generation(CompletionRequest, TextCompletion, TextCompletionEvent)
)
async def completions(request: Request, app: ServicesDep, admitted: Admitted) -> Response:
    return await _generate(request, app, admitted.principal, admitted.started_at, COMPLETION)


@router.get("/v1/models", responses=docs.errors(401, 500, 503), openapi_extra=docs.OPTIONAL_KEY)
async def models(app: ServicesDep, _: Caller) -> ModelList:
    cards = await app.catalog.models()
    return ModelList(
        data=[
            ModelEntry(
                id=c.name,
                created=c.created,
                max_model_len=c.max_model_len,
                engine=c.engine,
                speculation=list(c.speculation),
                default_speculation=c.default_speculation,
                provenance=c.provenance,
            )
            for c in cards
        ]
    )


@router.get("/healthz", responses=docs.errors(500, 503))
async def healthz(app: ServicesDep) -> Health:
    if app.broken:
        raise Unavailable("a background loop kept crashing", code="broken")
    return Health()


@router.get("/readyz", responses=docs.errors(500, 503))
async def readyz(app: ServicesDep) -> Readiness:
    """Ready when Redis answers and (unless DCOCO_READYZ_REQUIRES_WORKERS is off) at least one
    model has a live worker."""
    try:
        await app.queue.ping()
        cards = await app.catalog.models()
        alive = {c.name: await app.queue.live_workers(c.name, app.settings.lease_s) for c in cards}
    except UNAVAILABLE:
        raise Unavailable("Redis is unreachable") from None
    if app.settings.readyz_requires_workers and not any(alive.values()):
        raise Unavailable("no live worker for any model", code="no_workers")
    return Readiness(workers=alive)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **docs.errors(500),
    },
)
async def metrics(app: ServicesDep) -> Response:
    return Response(generate_latest(app.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def _generate(
    request: Request, app: Services, principal: str, started: float, route: Route
) -> Response:
    require_json(request)
    raw = await read_body(request, app.settings.max_body_bytes)
    async with app.lanes.enter(principal, len(raw)) as lane:
        body = await lane.run(parse, route.request, raw)
        _check_size(body, app.settings)
        model = await app.catalog.get(body.model)
        _check_capabilities(body, model)
        prompts = await lane.run(route.prompts, body, model)
    params = GenerationParams(
        max_tokens=budget(prompts, body.budget(), model, route.prompt_param),
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        stop=body.stops(),
    )
    request_id = route.id_prefix + uuid.uuid4().hex
    request.state.request_id = request_id
    answer = Answer(route.chat, request_id, int(time.time()), body.model, body.wants_usage_chunk())
    job = await app.jobs.submit(
        request_id,
        body.model,
        prompts,
        params,
        body.n,
        started,
        speculation=body.speculation,
        provenance=body.provenance,
    )
    try:
        if body.stream:
            # Errors before the first keep-alive keep their HTTP status; later ones are events.
            keepalive = app.settings.sse_keepalive_s
            await _unless_disconnected(request, app.jobs.wait_started(job, keepalive))
            pieces = Pieces(model.tokenizer, body.rejected_drafts) if body.provenance else None

            async def abandon() -> None:
                if not job.finished:
                    app.jobs.abandon(job)

            return EventStream(app.jobs.stream(job, answer, pieces), abandon)
        await _unless_disconnected(request, app.jobs.wait_started(job))
        choices = await _unless_disconnected(request, app.jobs.collect(job))
        return Response(dump(answer.response(choices, job.prompt_tokens)), media_type=JSON)
    except BaseException:
        if not job.finished:
            app.jobs.abandon(job)
        raise


def _check_size(body: Sampling, settings: GatewaySettings) -> None:
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


def _check_capabilities(body: Sampling, model: ServedModel) -> None:
    """Refuses a speculation or provenance the model's workers said they cannot give (a card
    that says nothing lets the request through: the worker then decides)."""
    card = model.card
    if (
        body.speculation is not None
        and card.speculation
        and body.speculation not in card.speculation
    ):
        raise UnsupportedValue(
            f"speculation {body.speculation!r} is not available for the model '{card.name}' "
            f"(engine {card.engine}); it can run: {', '.join(card.speculation)}",
            param="speculation",
        )
    if body.provenance and card.provenance is False:
        raise UnsupportedValue(
            f"provenance is not available for the model '{card.name}': its engine "
            f"({card.engine}) does not report where each token came from, nor the rejected "
            "drafts; usage still counts accepted and rejected drafted tokens",
            param="provenance",
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
            await self.cleanup()


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
