"""The gateway's OpenAPI document, with the real request and response bodies.

The routes read their bodies themselves (size limit first, then strict parsing), so FastAPI does
not see the pydantic models; this adds them, the completions and stream events the routes
answer, and OpenAI's error envelope for every error status, so that client generators and the
API fuzzer see what the routes accept and answer.
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from dcoco.gateway.response_schemas import REF, RESPONSE_SCHEMAS, ref
from dcoco.gateway.schemas import ChatRequest, CompletionRequest

ERROR_STATUSES = {
    "400": "Malformed, not JSON, unsupported, oversized for the context or the queue",
    "401": "Missing or invalid API key",
    "404": "Unknown model",
    "408": "The request's headers or body did not arrive in time",
    "413": "Request body too large",
    "429": "Rate, concurrency or queue-depth limit; see Retry-After",
    "499": "The client closed the connection",
    "500": "Internal error",
    "503": "Queue or model temporarily unavailable",
    "504": "Not picked up before the queue deadline, or the worker stalled",
}
# The generation routes: request body, response body, one event of the stream.
GENERATION_ROUTES: dict[str, tuple[type[BaseModel], str, str]] = {
    "/v1/chat/completions": (ChatRequest, "ChatCompletion", "ChatCompletionEvent"),
    "/v1/completions": (CompletionRequest, "TextCompletion", "TextCompletionEvent"),
}
# The error statuses of the other routes.
OTHER_ROUTES = {
    "/v1/models": ("401", "500", "503"),
    "/healthz": ("500", "503"),
    "/readyz": ("500", "503"),
    "/metrics": ("500",),
}


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(RESPONSE_SCHEMAS)
    errors = {
        status: {
            "description": description,
            "content": {"application/json": {"schema": ref("ErrorEnvelope")}},
        }
        for status, description in ERROR_STATUSES.items()
    }
    for path, (model, completion, event) in GENERATION_ROUTES.items():
        body = model.model_json_schema(ref_template=REF)
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": ref(model.__name__)}},
        }
        operation["responses"] = {
            "200": {
                "description": "The completion, or server-sent events when stream is true",
                "content": {
                    "application/json": {"schema": ref(completion)},
                    # Before OpenAPI 3.2, the schema of an event stream describes one event.
                    "text/event-stream": {"schema": ref(event)},
                },
            },
            **errors,
        }
    for path, statuses in OTHER_ROUTES.items():
        responses = schema["paths"][path]["get"]["responses"]
        responses.update({status: errors[status] for status in statuses})
    metrics = schema["paths"]["/metrics"]["get"]["responses"]["200"]
    metrics["content"] = {"text/plain": {"schema": {"type": "string"}}}
    app.openapi_schema = schema
    return schema
