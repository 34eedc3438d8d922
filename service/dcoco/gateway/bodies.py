"""Reading a request body: JSON only, within the size limit, and a client that goes away or is
too slow while sending it is a 499 or a 408, never an internal error."""

from starlette.requests import ClientDisconnect, Request

from dcoco.gateway.errors import Cancelled, InvalidRequest, PayloadTooLarge, RequestTimeout

JSON = "application/json"
# Set on the request's state by the HTTP protocol when it gave up on a slow body (server.py).
BODY_TIMED_OUT = "body_timed_out"


def require_json(request: Request) -> None:
    """A body that does not say it is JSON is refused, as OpenAI's API does, before it is read."""
    declared = request.headers.get("content-type")
    media_type = (declared or "").partition(";")[0].strip().lower()
    if media_type != JSON:
        shown = "no Content-Type" if declared is None else f"Content-Type: {declared}"
        raise InvalidRequest(
            f"this route accepts '{JSON}' bodies only, and the request has {shown}",
            code="unsupported_content_type",
        )


async def read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLarge(f"the request body exceeds {limit} bytes")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body.extend(chunk)
            if len(body) > limit:
                raise PayloadTooLarge(f"the request body exceeds {limit} bytes")
    except ClientDisconnect:
        if getattr(request.state, BODY_TIMED_OUT, False):
            raise RequestTimeout("the request body did not arrive in time") from None
        raise Cancelled("the client closed the connection while sending the body") from None
    return bytes(body)
