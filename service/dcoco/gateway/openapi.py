"""The gateway's OpenAPI document, with the real request bodies of the generation routes.

The routes read their bodies themselves (size limit first, then strict parsing), so FastAPI does
not see the pydantic models; this adds them, and OpenAI's error envelope for every error status,
so that client generators and the API fuzzer see what the routes accept and answer.
"""

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from dcoco.gateway.schemas import ChatRequest, CompletionRequest

REF = "#/components/schemas/{model}"
ERROR_STATUSES = {
    "400": "Malformed, unsupported or oversized for the context",
    "401": "Missing or invalid API key",
    "404": "Unknown model",
    "413": "Request body too large",
    "429": "Rate, concurrency or queue-depth limit; see Retry-After",
    "499": "The client closed the connection",
    "500": "Internal error",
    "503": "Queue or model temporarily unavailable",
    "504": "Not picked up before the queue deadline, or the worker stalled",
}
ERROR_ENVELOPE: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
GENERATION_ROUTES: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatRequest,
    "/v1/completions": CompletionRequest,
}


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema is not None:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorEnvelope"] = ERROR_ENVELOPE
    errors = {
        status: {
            "description": description,
            "content": {
                "application/json": {"schema": {"$ref": REF.format(model="ErrorEnvelope")}}
            },
        }
        for status, description in ERROR_STATUSES.items()
    }
    for path, model in GENERATION_ROUTES.items():
        body = model.model_json_schema(ref_template=REF)
        components.update(body.pop("$defs", {}))
        components[model.__name__] = body
        operation = schema["paths"][path]["post"]
        operation["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": REF.format(model=model.__name__)}}},
        }
        operation["responses"] = {
            "200": {
                "description": "The completion, or server-sent events when stream is true",
                "content": {
                    "application/json": {"schema": {"type": "object"}},
                    "text/event-stream": {"schema": {"type": "string"}},
                },
            },
            **errors,
        }
    app.openapi_schema = schema
    return schema
