"""One typed error tree, mapped to OpenAI's error envelope:

{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
"""

from typing import Any

from dcoco.gateway.replies import ErrorDetail, ErrorEnvelope


class APIError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.param = message, param
        self.code = code or self.code
        self.headers = headers or {}

    def envelope(self) -> ErrorEnvelope:
        return ErrorEnvelope(
            error=ErrorDetail(
                message=self.message, type=self.type, param=self.param, code=self.code
            )
        )

    def body(self) -> dict[str, Any]:
        return self.envelope().model_dump()


class InvalidRequest(APIError):
    status, type, code = 400, "invalid_request_error", "invalid_request"


class Unsupported(InvalidRequest):
    code = "unsupported_parameter"


class UnsupportedValue(InvalidRequest):
    """A parameter this server knows, with a value the model's workers cannot honour."""

    code = "unsupported_value"


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = "payload_too_large"


class RequestTimeout(InvalidRequest):
    """The client was too slow to send its request; the connection is closed after it."""

    status, code = 408, "request_timeout"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"Connection": "close"})


class Unauthorized(APIError):
    """401 with `WWW-Authenticate: Bearer` (RFC 6750), which says how to authenticate."""

    status, type, code = 401, "invalid_request_error", "invalid_api_key"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class ModelNotFound(APIError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class NotFound(APIError):
    status, type, code = 404, "invalid_request_error", "not_found"


class RateLimited(APIError):
    """429 with Retry-After; `code` says which limit: rate, concurrency or queue depth."""

    status, type, code = 429, "rate_limit_error", "rate_limit_exceeded"

    def __init__(self, message: str, retry_after_s: float, code: str) -> None:
        seconds = str(max(1, round(retry_after_s + 0.499)))
        super().__init__(message, code=code, headers={"Retry-After": seconds})


class Unavailable(APIError):
    status, type, code = 503, "service_unavailable_error", "queue_unavailable"


class ModelUnavailable(Unavailable):
    """A known model that cannot take requests right now; retry shortly."""

    code = "model_unavailable"

    def __init__(self, message: str, retry_after_s: int = 2) -> None:
        super().__init__(message, param="model", headers={"Retry-After": str(retry_after_s)})


class Timeout(APIError):
    status, type, code = 504, "timeout_error", "queue_timeout"


class Cancelled(APIError):
    status, type, code = 499, "invalid_request_error", "cancelled"


def from_worker(status: int, code: str, message: str) -> APIError:
    """An error a worker reported on the response stream, as the gateway answers it."""
    kind = {400: InvalidRequest, 499: Cancelled, 503: Unavailable, 504: Timeout}.get(
        status, APIError
    )
    return kind(message, code=code)
