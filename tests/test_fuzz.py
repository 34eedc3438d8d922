"""Property-based fuzzing of the HTTP API (schemathesis) against the gateway's own OpenAPI
schema, on real processes over loopback: redis-server, a worker with the instant engine and a
`dcoco gateway`, so that uvicorn's HTTP parsing, SSE over a socket, the queue and the worker's
detokenizer and stop strings are all in the path.

Checks on every response: no 5xx; status, content type, headers and body (each event of a
stream too) as the schema documents them; schema-invalid input refused with a 4xx; OpenAI's
error envelope on every error, documented or not (405, unknown routes); and every event stream
read to its `[DONE]` within the client's time limit, so a hang fails the case.

CI runs a bounded, derandomized number of cases. `make fuzz` runs FUZZ_EXAMPLES cases per
operation with the seed FUZZ_SEED (fresh in each run unless given).
"""

import os
from collections.abc import Iterator
from typing import Any

import jsonschema_rs
import pytest
import schemathesis
from schemathesis import checks

from dcoco.gateway.app import create_app
from dcoco.gateway.replies import ErrorEnvelope
from dcoco.settings import GatewaySettings
from dcoco.tokenizer import save_tokenizer, train_tokenizer
from factories import TEXTS
from stack import Stack

pytestmark = pytest.mark.slow
CI_EXAMPLES = 400  # per operation, after the deterministic coverage phase (about 550 cases)
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", CI_EXAMPLES))
SEED = os.environ.get("FUZZ_SEED")
VOCAB = 300
# Every request, a whole stream included, must be answered within this: well above the
# stack's own limits (queue deadline and stall timeout of 5 s each).
REQUEST_TIMEOUT_S = 20.0
ENVELOPE = jsonschema_rs.validator_for(ErrorEnvelope.model_json_schema())


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The instant engine answers at once (it needs only a tokenizer), so the fuzzer's time
    goes to the gateway and the queue."""
    root = tmp_path_factory.mktemp("fuzz")
    save_tokenizer(train_tokenizer(TEXTS * 20, vocab_size=VOCAB), root / "model")
    started = Stack(
        root,
        {"target": root / "model", "dcoco": root / "model"},
        DCOCO_ENGINE="instant",
        DCOCO_SSE_KEEPALIVE_S="1",
        DCOCO_QUEUE_TIMEOUT_S="5",
        DCOCO_STALL_TIMEOUT_S="5",
    )
    try:
        yield started.start()
    finally:
        started.stop()


def served(document: dict[str, Any]) -> dict[str, Any]:
    """The schema as this stack serves it: `model` is the served model, `n` at most the
    gateway's limit, prompts not empty and token ids below the vocabulary. Most positive cases
    then get past the catalog and the limits to the tokenizer, the queue and the worker;
    negative cases still break each of these."""
    bodies = {
        path: document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        for path in ("/v1/chat/completions", "/v1/completions")
    }
    for body in bodies.values():
        properties = body["schema"]["properties"]
        properties["model"] = {"const": Stack.MODEL}
        properties["n"]["maximum"] = GatewaySettings().max_n
    pending = [bodies["/v1/completions"]["schema"]["properties"]["prompt"]]
    while pending:  # the prompt's forms: text, texts, token ids, lists of token ids
        node = pending.pop()
        pending += node.get("anyOf", []) + ([node["items"]] if "items" in node else [])
        if node.get("type") == "string":
            node["minLength"] = 1
        if node.get("type") == "integer":
            node["maximum"] = VOCAB - 1
    return document


def load_schema() -> schemathesis.BaseSchema:
    """The schema the gateway serves at /openapi.json (building the app connects to nothing).

    Built at import rather than from the stack fixture: schemathesis's lazy loader
    (`schemathesis.pytest.from_fixture`) sets `node._nodeid`, which pytest 9 no longer has."""
    settings: dict[str, Any] = {
        "request-timeout": REQUEST_TIMEOUT_S,
        "max-stream-events": 1_000_000,  # read every stream to its end
        "generation": {
            "mode": "all",  # positive and negative cases
            "max-examples": EXAMPLES,
            "deterministic": SEED is None and EXAMPLES == CI_EXAMPLES,
            "database": "none",
        },
    }
    if SEED is not None:
        settings["seed"] = int(SEED)
    config = schemathesis.Config.from_dict(settings)
    return schemathesis.openapi.from_dict(
        served(create_app(GatewaySettings()).openapi()), config=config
    )


schema = load_schema()


def error_envelope(ctx: checks.CheckContext, response: schemathesis.Response, case: Any) -> None:
    """Every error, documented status or not, is OpenAI's envelope and nothing else."""
    if response.status_code >= 400:
        ENVELOPE.validate(response.json())


def complete_stream(ctx: checks.CheckContext, response: schemathesis.Response, case: Any) -> None:
    """An event stream ended on its own, with [DONE] as its last event and only there. (The
    schema check validates each event: a chunk, or an error in OpenAI's envelope.)"""
    if not response.headers.get("content-type", [""])[0].startswith("text/event-stream"):
        return
    assert not response.stream_cut_short, "the stream did not end within the time limit"
    blocks = response.content.decode().split("\n\n")
    data = [block.removeprefix("data: ") for block in blocks if block.startswith("data: ")]
    assert data[-1:] == ["[DONE]"], f"the stream ended without [DONE]: {data[-3:]}"
    assert "[DONE]" not in data[:-1], "[DONE] before the end of the stream"


CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_headers_conformance,
    checks.response_schema_conformance,
    checks.negative_data_rejection,
    checks.unsupported_method,
    error_envelope,
    complete_stream,
]


@schema.parametrize()
def test_the_api_holds_under_fuzzing(stack: Stack, case: schemathesis.Case) -> None:
    response = case.call(base_url=stack.url, timeout=REQUEST_TIMEOUT_S)
    case.validate_response(response, checks=CHECKS)
