"""uvicorn's httptools protocol with deadlines on slow and idle clients.

uvicorn closes a keep-alive connection that stays idle after a response, but not a new one that
never sends a byte, nor a request whose headers or body trickle in. Each phase of a connection
gets a deadline here, and each closure is counted (dcoco_client_timeouts_total{phase}):

- idle: no request under way, on a new connection or after a response: uvicorn's own keep-alive
  timer (`timeout_keep_alive`), armed here on a new connection too;
- headers: from a request's first byte to the end of its headers;
- body: from the end of the headers to the end of the body.

A request that runs out of time gets a 408 in OpenAI's envelope if nothing was answered yet, and
its connection is closed. Its handler then sees the client gone; the request's state says why
(bodies.BODY_TIMED_OUT), so the request is counted as the 408 it was, not as a 499.
"""

import asyncio
import json
from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from dcoco.gateway.bodies import BODY_TIMED_OUT
from dcoco.gateway.errors import RequestTimeout


def timeout_response(phase: str, limit_s: float) -> bytes:
    body = json.dumps(
        RequestTimeout(f"the request {phase} did not arrive within {limit_s:g} s").body()
    ).encode()
    head = (
        b"content-type: application/json\r\n"
        b"content-length: %d\r\n"
        b"connection: close\r\n\r\n" % len(body)
    )
    return STATUS_LINE[408] + head + body


def protocol_with_deadlines(
    headers_s: float, body_s: float, closed: Callable[[str], None]
) -> type[HttpToolsProtocol]:
    """The protocol class for uvicorn's `http` option; `closed(phase)` counts each closure."""

    class DeadlineProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def timeout_keep_alive_handler(self) -> None:
            if not self.transport.is_closing():
                closed("idle")
            super().timeout_keep_alive_handler()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm("headers", headers_s)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm("body", body_s)

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()

        def _arm(self, phase: str, limit_s: float) -> None:
            self._disarm()
            self.deadline = self.loop.call_later(limit_s, self._expire, phase, limit_s)

        def _disarm(self) -> None:
            if self.deadline is not None:
                self.deadline.cancel()
                self.deadline = None

        def _expire(self, phase: str, limit_s: float) -> None:
            self.deadline = None
            if self.transport.is_closing():
                return
            closed(phase)
            if phase == "body":
                self.cycle.scope["state"][BODY_TIMED_OUT] = True
            if self._can_answer(phase):
                self.transport.write(timeout_response(phase, limit_s))
            self.transport.close()

        def _can_answer(self, phase: str) -> bool:
            """Whether a 408 can be written without cutting into a response under way: the
            previous request's (headers of a pipelined request stalled) or this one's."""
            if phase == "headers":
                return self.cycle is None or self.cycle.response_complete
            return not self.pipeline and not self.cycle.response_started

    return DeadlineProtocol
