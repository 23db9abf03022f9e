"""``POST /debug/profile`` (only with ``--enable-profiling``): profile the next N engine steps
of the live server and answer the summary (backend.profiling.summary) as JSON.

Bearer token from the env var BACKEND_PROFILE_TOKEN, compared in constant time and never
logged; N bounded (1..MAX_STEPS); one capture at a time (409 while one runs). The capture
runs in the engine thread between steps, so serving goes on meanwhile; its trace (chrome
JSON, opens in Perfetto) is stored under the profile directory and named in the answer.
"""
from __future__ import annotations

import hmac
import os
from pathlib import Path

from aiohttp import web

from backend.profiling.summary import render

from .config import PROFILE_TOKEN_ENV
from .errors import APIError, bad_request
from .handlers import STATE
from .protocol import read_json

MAX_STEPS = 1000
DEFAULT_TIMEOUT_S = 60.0  # an idle engine runs no steps: answer with what was captured
MAX_TIMEOUT_S = 600.0
_FIELDS = ("steps", "timeout_s")


class ProfileEndpoint:
    def __init__(self, token: str, out_dir: Path) -> None:
        if not token:
            raise ValueError("the profiling token is empty")
        self._token = token.encode()
        self._out_dir = out_dir
        self._running = False  # one event loop: a plain flag is enough

    @classmethod
    def from_env(cls, out_dir: str | Path) -> "ProfileEndpoint":
        token = os.environ.get(PROFILE_TOKEN_ENV, "")
        if not token:
            raise ValueError(f"--enable-profiling needs a bearer token in the env var "
                             f"{PROFILE_TOKEN_ENV}; refusing to serve /debug/profile "
                             f"without authentication")
        return cls(token, Path(out_dir))

    async def warm(self, app: web.Application) -> None:
        """on_startup: the profiler's one-time initialisation, before any traffic."""
        app[STATE].engine.warm_profiler()

    def _authorize(self, request: web.Request) -> None:
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(),
                                                                 self._token):
            raise APIError(401, "missing or wrong bearer token for /debug/profile",
                           type="authentication_error", code="invalid_profile_token")

    async def handle(self, request: web.Request) -> web.Response:
        self._authorize(request)
        body = await read_json(request)
        unknown = sorted(set(body) - set(_FIELDS))
        if unknown:
            raise bad_request(f"unknown field {unknown[0]!r}; accepted: {', '.join(_FIELDS)}",
                              param=unknown[0])
        steps = body.get("steps")
        if isinstance(steps, bool) or not isinstance(steps, int) \
                or not 1 <= steps <= MAX_STEPS:
            raise bad_request(f"'steps' must be an integer from 1 to {MAX_STEPS}, got "
                              f"{steps!r}", param="steps")
        timeout = body.get("timeout_s", DEFAULT_TIMEOUT_S)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) \
                or not 0 < timeout <= MAX_TIMEOUT_S:
            raise bad_request(f"'timeout_s' must be a number in (0, {MAX_TIMEOUT_S:g}], got "
                              f"{timeout!r}", param="timeout_s")
        if self._running:
            raise APIError(409, "a profile capture is already running; retry when it ends",
                           type="conflict_error", code="profile_in_progress")
        self._running = True
        try:
            report = await request.app[STATE].engine.profile(steps, self._out_dir,
                                                             float(timeout))
        finally:
            self._running = False
        report["summary"] = render(report)
        return web.json_response(report)
