"""The routes' OpenAPI declarations, made with FastAPI's own parameters and generated from the
models in `schemas.py` and `replies.py`.

- `responses`: OpenAI's error envelope for every error status a route answers, and for the
  generation routes the completion (application/json) and one event of its stream
  (text/event-stream; before OpenAPI 3.2, the schema of an event stream describes one event).
- `openapi_extra`: the request body of the generation routes. They read and parse their bodies
  themselves (limits first, parsing off the event loop), so FastAPI does not see the model; the
  body's schema is the model's, declared here.

Schemas given through `openapi_extra` or a response's `content` are inlined: a reference there
would point at a component FastAPI never registered.
"""

from typing import Any

from pydantic import BaseModel

from dcoco.gateway.replies import ErrorEnvelope

ERROR_STATUSES = {
    400: "Malformed, not JSON, unsupported, oversized for the context or the queue",
    401: "Missing or invalid API key",
    404: "Unknown model",
    408: "The request's headers or body did not arrive in time",
    413: "Request body too large",
    429: "Rate, concurrency or queue-depth limit; see Retry-After",
    499: "The client closed the connection",
    500: "Internal error",
    503: "Queue or model temporarily unavailable",
    504: "Not picked up before the queue deadline, or the worker stalled",
}
Responses = dict[int | str, dict[str, Any]]
# The bearer key (FastAPI declares it from the `caller` dependency) or none: keys are optional,
# on only where the gateway has some. An empty requirement is OpenAPI's "anonymous allowed".
OPTIONAL_KEY: dict[str, Any] = {"security": [{}]}


def errors(*statuses: int) -> Responses:
    """OpenAI's error envelope under each status."""
    return {
        status: {"model": ErrorEnvelope, "description": ERROR_STATUSES[status]}
        for status in statuses
    }


def generation(
    request: type[BaseModel], completion: type[BaseModel], event: type[BaseModel]
) -> dict[str, Any]:
    """The route arguments of a generation route: its body, its answers, its errors."""
    stream = {"schema": inline(event, "serialization")}
    return {
        "response_model": None,
        "responses": {
            200: {
                "model": completion,
                "description": "The completion, or server-sent events when stream is true",
                "content": {"text/event-stream": stream},
            },
            **errors(*ERROR_STATUSES),
        },
        "openapi_extra": OPTIONAL_KEY
        | {
            "requestBody": {
                "required": True,
                "content": {"application/json": {"schema": inline(request, "validation")}},
            }
        },
    }


def inline(model: type[BaseModel], mode: str) -> dict[str, Any]:
    """The model's JSON schema with every reference replaced by what it names."""
    schema = model.model_json_schema(mode=mode)  # type: ignore[arg-type]
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, list):
            return [resolve(item) for item in node]
        if not isinstance(node, dict):
            return node
        if "$ref" in node:
            named = definitions[node["$ref"].rsplit("/", 1)[-1]]
            rest = {key: value for key, value in node.items() if key != "$ref"}
            return resolve(named | rest)
        return {key: resolve(value) for key, value in node.items()}

    resolved: dict[str, Any] = resolve(schema)
    return resolved
