"""Counts and logs every HTTP request: route, status, latency. Never the prompt text, unless
DCOCO_LOG_PROMPTS is set (then the request body is logged too)."""

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dcoco.gateway.metrics import GatewayMetrics

log = logging.getLogger("dcoco.access")
ROUTES = {
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/healthz",
    "/readyz",
    "/metrics",
    "/playground",
}


class ObserveRequests:
    def __init__(self, app: ASGIApp, metrics: GatewayMetrics, log_prompts: bool) -> None:
        self.app, self.metrics, self.log_prompts = app, metrics, log_prompts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500
        body = bytearray()

        async def observe_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        async def observe_receive() -> Message:
            message = await receive()
            if self.log_prompts and message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        try:
            await self.app(scope, observe_receive, observe_send)
        finally:
            path = scope["path"]
            route = path if path in ROUTES else "other"
            self.metrics.requests.labels(route, str(status)).inc()
            fields = {
                "method": scope["method"],
                "route": route,
                "status": status,
                "ms": round((time.monotonic() - started) * 1000, 2),
                "request_id": scope.get("state", {}).get("request_id"),
                "principal": scope.get("state", {}).get("principal"),
            }
            if self.log_prompts and body:
                fields["body"] = body.decode("utf-8", "replace")
            log.info("request", extra=fields)
