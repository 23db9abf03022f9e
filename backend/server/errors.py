"""OpenAI-shaped HTTP errors and the one middleware that turns domain errors into them."""
from __future__ import annotations

import json
import logging
from typing import Awaitable, Callable

from aiohttp import web

from backend.engine.errors import RequestRejected

log = logging.getLogger("backend.server")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class APIError(Exception):
    """An error with an HTTP status and the OpenAI error body fields."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


FAILURE = web.RequestKey("failure", APIError)  # the error a request ended with, if any
CLIENT_CLOSED_REQUEST = 499  # nginx's status for a client that left before the response


def error_response(err: APIError) -> web.Response:
    return web.Response(status=err.status, text=json.dumps(err.body()),
                        content_type="application/json")


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except APIError as err:
        failure = err
    except RequestRejected as err:
        failure = bad_request(err.message, err.param)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        # Unknown routes and wrong methods also answer in the OpenAI error shape.
        kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
        failure = APIError(exc.status, exc.reason or str(exc), type=kind)
    except ConnectionError:
        # The client's connection is gone (its body cut short, our headers unsendable):
        # nothing failed on this side, and nobody is left to answer; nothing was started
        # (a stream that had begun handles its own disconnect and frees the engine request).
        log.info("client disconnected from %s %s before the response", request.method,
                 request.path)
        return web.Response(status=CLIENT_CLOSED_REQUEST)
    except Exception:  # noqa: BLE001 - last resort: log it, answer 500 in the OpenAI shape
        log.exception("unhandled error in %s %s", request.method, request.path)
        failure = APIError(500, "internal server error", type="server_error",
                           code="internal_error")
    request[FAILURE] = failure
    return error_response(failure)
