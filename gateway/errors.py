"""Domain errors and their OpenAI-shaped HTTP form: ``{"error": {message, type, param, code}}``."""
from __future__ import annotations

import json
from typing import Any


class ConfigError(ValueError):
    """The configuration file is invalid; the message names the offending key."""


class GatewayError(Exception):
    """An error the client should see, with its HTTP status and OpenAI error fields."""

    status = 500
    type = "server_error"
    code = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def sse(self) -> bytes:
        """The error as a final SSE event (the stream then ends without [DONE])."""
        return b"data: " + json.dumps(self.body()).encode() + b"\n\n"


class BadRequest(GatewayError):
    status, type, code = 400, "invalid_request_error", "invalid_request"


class Unauthorized(GatewayError):
    status, type, code = 401, "authentication_error", "invalid_api_key"


class Forbidden(GatewayError):
    status, type, code = 403, "permission_error", "model_not_allowed"


class NotFound(GatewayError):
    status, type, code = 404, "invalid_request_error", "model_not_found"


class RequestTimeout(GatewayError):
    status, type, code = 408, "invalid_request_error", "request_timeout"


class PayloadTooLarge(GatewayError):
    status, type, code = 413, "invalid_request_error", "request_too_large"


class RateLimited(GatewayError):
    status, type, code = 429, "rate_limit_error", "upstream_rate_limited"


class BadGateway(GatewayError):
    status, type, code = 502, "upstream_error", "upstream_error"


class Unavailable(GatewayError):
    status, type, code = 503, "upstream_error", "upstream_unavailable"


class GatewayTimeout(GatewayError):
    status, type, code = 504, "upstream_error", "upstream_timeout"


class UpstreamStatus(GatewayError):
    """A non-retryable 4xx from the upstream, relayed with its own status and error fields."""

    type = "invalid_request_error"
    code = "upstream_rejected"

    def __init__(self, status: int, body: dict[str, Any] | None, fallback: str) -> None:
        err = (body or {}).get("error") if isinstance(body, dict) else None
        err = err if isinstance(err, dict) else {}
        super().__init__(str(err.get("message") or fallback), param=err.get("param"),
                         code=str(err.get("code") or self.code))
        self.status = status
        if isinstance(err.get("type"), str):
            self.type = err["type"]


def status_error(status: int, message: str) -> GatewayError:
    """An OpenAI-shaped error for a plain HTTP status (aiohttp's own 404/405/413 ...)."""
    for cls in (BadRequest, Unauthorized, Forbidden, NotFound, PayloadTooLarge):
        if cls.status == status:
            return cls(message, code="not_found" if status == 404 else None)
    err = GatewayError(message, code=f"http_{status}")
    err.status = status
    err.type = "invalid_request_error" if status < 500 else "server_error"
    return err
