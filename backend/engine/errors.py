"""Domain errors the server turns into HTTP responses."""
from __future__ import annotations


class RequestRejected(ValueError):
    """A request the engine can never serve (HTTP 400).

    ``param`` names the offending request field (OpenAI error shape), e.g. ``"messages"``
    for a prompt that is too long or ``"max_tokens"``.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class EngineNotRunning(RuntimeError):
    """generate()/check_request() called before start() or after stop()."""


class StepFailed(RuntimeError):
    """The engine step that carried this request raised; only the requests that broke the
    step (or every request of a step that could not be narrowed down) get it."""
