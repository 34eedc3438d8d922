"""What the routes depend on, as FastAPI dependencies: the app's services, the caller (an API
key, when keys are on), and admission under the caller's rate and concurrency limits, held until
the response, a whole stream included, has been sent.

Every dependency is a coroutine, though `services` and `caller` never wait: FastAPI runs a plain
function on its thread pool, a thread hop in front of every request for each."""

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

import anyio
from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from dcoco.gateway.services import Services
from dcoco.queue.connection import UNAVAILABLE

BEARER = HTTPBearer(
    auto_error=False,  # the guard answers: OpenAI's envelope, and only when keys are on
    description="An API key, when the gateway has keys (DCOCO_API_KEYS, DCOCO_API_KEYS_FILE).",
)


async def services(request: Request) -> Services:
    found = request.app.state.services
    assert isinstance(found, Services)
    return found


ServicesDep = Annotated[Services, Depends(services)]


async def caller(
    request: Request,
    app: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
) -> str:
    """The caller's principal (a key id); 401 without a valid key when keys are on."""
    request.state.started_at = time.monotonic()
    principal = app.guard.authenticate(None if credentials is None else credentials.credentials)
    request.state.principal = principal
    return principal


Caller = Annotated[str, Depends(caller)]


@dataclass(frozen=True)
class Admission:
    principal: str
    started_at: float  # monotonic, when the request arrived


async def admission(
    request: Request, app: ServicesDep, principal: Caller
) -> AsyncIterator[Admission]:
    """Applies the caller's rate and concurrency limits (429), before the body is read; the
    concurrency slot is freed once the response has been sent or has failed."""
    release = await app.guard.admit(principal)
    try:
        yield Admission(principal, request.state.started_at)
    finally:
        await shielded(release)


Admitted = Annotated[Admission, Depends(admission)]


async def shielded(release: Callable[[], Awaitable[None]]) -> None:
    with anyio.CancelScope(shield=True), contextlib.suppress(*UNAVAILABLE):
        await release()  # if Redis is down, the slot's lease expires on its own
