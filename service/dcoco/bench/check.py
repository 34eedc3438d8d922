"""Before any load: every server's URL is well formed, answers, and speaks OpenAI's API (a JSON
model list on `GET /v1/models`) with the model asked for. Each problem is one UsageError."""

import json
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from dcoco.bench.client import Server
from dcoco.shared.errors import UsageError

PROBE_TIMEOUT_S = 10.0


def base_url(text: str, what: str) -> str:
    """An http(s) URL with a host, without a trailing slash or /v1."""
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(f"{what} {text!r}: not an http:// or https:// URL with a host")
    try:
        parts.port  # noqa: B018 - validates the port number
    except ValueError:
        raise UsageError(f"{what} {text!r}: bad port") from None
    if parts.query or parts.fragment:
        raise UsageError(f"{what} {text!r}: a base URL has no query or fragment")
    return text.strip().rstrip("/").removesuffix("/v1")


async def models_of(http: aiohttp.ClientSession, url: str) -> list[str]:
    """The model ids a server lists; a UsageError says what is wrong otherwise."""
    where = f"{url}/v1/models"
    try:
        async with http.get(where, timeout=aiohttp.ClientTimeout(total=PROBE_TIMEOUT_S)) as reply:
            status, kind = reply.status, reply.content_type
            text = await reply.text()
    except TimeoutError:
        raise UsageError(f"{url}: no answer within {PROBE_TIMEOUT_S:g} s") from None
    except aiohttp.ClientError as problem:
        reason = getattr(problem, "os_error", None) or problem
        raise UsageError(f"{url}: unreachable ({reason})") from None
    if status != 200:
        raise UsageError(f"{url}: not an OpenAI-compatible server (GET /v1/models: HTTP {status})")
    listed = _model_ids(text) if kind == "application/json" else None
    if listed is None:
        raise UsageError(
            f"{url}: not an OpenAI-compatible server (GET /v1/models: {kind or 'no type'}, "
            "not a JSON model list)"
        )
    return listed


def _model_ids(text: str) -> list[str] | None:
    try:
        body: Any = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("data"), list):
        return None
    return [str(m["id"]) for m in body["data"] if isinstance(m, dict) and "id" in m]


async def resolve(
    http: aiohttp.ClientSession, name: str, url: str, model: str | None, metrics_url: str | None
) -> Server:
    """The server checked, with its model: the one asked for, or the only one it lists."""
    listed = await models_of(http, url)
    if model is None:
        if len(listed) != 1:
            choices = ", ".join(listed) or "none"
            raise UsageError(
                f"{url} serves {len(listed)} models ({choices}): name one with --model"
            )
        model = listed[0]
    elif model not in listed:
        raise UsageError(
            f"{url} does not serve {model!r}; it serves: {', '.join(listed) or 'none'}"
        )
    return Server(name, url, model, metrics_url)
