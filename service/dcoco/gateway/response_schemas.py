"""JSON schemas of what the gateway answers: the objects `formats.py` writes, the server-sent
events of a stream, and OpenAI's error envelope. The OpenAPI document publishes them as
components, so that a client generator or the API fuzzer can check every response."""

from typing import Any

REF = "#/components/schemas/{model}"
NULL = {"type": "null"}


def ref(name: str) -> dict[str, str]:
    return {"$ref": REF.format(model=name)}


def _object(properties: dict[str, Any], optional: tuple[str, ...] = ()) -> dict[str, Any]:
    required = [name for name in properties if name not in optional]
    return {"type": "object", "required": required, "properties": properties}


def _completion(kind: str, choice: dict[str, Any], chunk: bool = False) -> dict[str, Any]:
    """A whole response, or one chunk of a stream (whose usage is null, or absent unless the
    client asked for it with stream_options.include_usage)."""
    properties = {
        "id": {"type": "string"},
        "object": {"const": kind},
        "created": {"type": "integer"},
        "model": {"type": "string"},
        "choices": {"type": "array", "items": choice},
        "usage": {"anyOf": [ref("Usage"), NULL]} if chunk else ref("Usage"),
    }
    return _object(properties, optional=("usage",) if chunk else ())


def _sse(chunk: str) -> dict[str, Any]:
    """One event of a stream: a chunk, an error in the envelope, or the final `[DONE]`."""
    payload = {"oneOf": [ref(chunk), ref("ErrorEnvelope")]}
    data = {
        "anyOf": [
            {"const": "[DONE]"},
            {"contentMediaType": "application/json", "contentSchema": payload},
        ]
    }
    return _object({"data": data})


FINISH = {"enum": ["stop", "length", None]}
INT = {"type": "integer", "minimum": 0}
CHAT_CHOICE = _object(
    {
        "index": INT,
        "message": _object(
            {"role": {"const": "assistant"}, "content": {"type": "string"}, "refusal": NULL}
        ),
        "logprobs": NULL,
        "finish_reason": FINISH,
    }
)
CHAT_DELTA = _object(
    {
        "index": INT,
        "delta": _object(
            {"role": {"const": "assistant"}, "content": {"type": "string"}},
            optional=("role", "content"),
        ),
        "logprobs": NULL,
        "finish_reason": FINISH,
    }
)
TEXT_CHOICE = _object(
    {"index": INT, "text": {"type": "string"}, "logprobs": NULL, "finish_reason": FINISH}
)

RESPONSE_SCHEMAS: dict[str, dict[str, Any]] = {
    "ErrorEnvelope": _object(
        {
            "error": _object(
                {
                    "message": {"type": "string"},
                    "type": {"type": "string"},
                    "param": {"type": ["string", "null"]},
                    "code": {"type": ["string", "null"]},
                }
            )
            | {"additionalProperties": False}
        }
    )
    | {"additionalProperties": False},
    "Usage": _object(
        {
            "prompt_tokens": INT,
            "completion_tokens": INT,
            "total_tokens": INT,
            "completion_tokens_details": _object(
                {"accepted_prediction_tokens": INT, "rejected_prediction_tokens": INT}
            ),
        }
    ),
    "ChatCompletion": _completion("chat.completion", CHAT_CHOICE),
    "ChatCompletionChunk": _completion("chat.completion.chunk", CHAT_DELTA, chunk=True),
    "ChatCompletionEvent": _sse("ChatCompletionChunk"),
    "TextCompletion": _completion("text_completion", TEXT_CHOICE),
    "TextCompletionChunk": _completion("text_completion", TEXT_CHOICE, chunk=True),
    "TextCompletionEvent": _sse("TextCompletionChunk"),
}
