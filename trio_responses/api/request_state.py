"""What the request pipeline learned of the request being handled (`pipeline`).

A context variable, set when the pipeline takes a request (or WebSocket): the
views, error handlers and the jobs a request starts see it in their tasks.
"""

from __future__ import annotations

import time
from contextvars import ContextVar
from typing import final

from ..protocol.errors import ErrorInfo


@final
class RequestState:
    """What the pipeline knows of the request (or WebSocket) being handled."""

    __slots__ = (
        "body_read",
        "error",
        "method",
        "owner",
        "path",
        "request_id",
        "response_id",
        "route",
        "started",
    )

    def __init__(self, request_id: str, method: str, path: str) -> None:
        self.request_id = request_id
        self.method = method
        self.path = path
        self.started = time.perf_counter()
        self.owner: str | None = None
        """The caller's owner tag; None without API keys (and on open routes)."""
        self.route: str | None = None
        """The matched route's template (None: no route matched)."""
        self.response_id: str | None = None
        """The response the path names, if any."""
        self.error: ErrorInfo | None = None
        """The error object the request was answered with, for its log line."""
        self.body_read = False


_current: ContextVar[RequestState | None] = ContextVar("trio_responses_request", default=None)


def enter_request(state: RequestState) -> None:
    """Make ``state`` the current request's, for this task and those it starts."""
    _current.set(state)


def current_request() -> RequestState:
    """The state of the request being handled (in the pipeline's task tree).

    Raises:
        LookupError: outside a request served through `Pipeline`.
    """
    state = _current.get()
    if state is None:
        raise LookupError("not in a request served through the pipeline")
    return state


def caller() -> str | None:
    """The owner tag of the current request's caller (None without API keys)."""
    return current_request().owner


def note_error(error: ErrorInfo) -> None:
    """Record ``error`` as what the current request was answered with (for its
    log line), when there is a current request."""
    state = _current.get()
    if state is not None:
        state.error = error


__all__ = ["RequestState", "caller", "current_request", "enter_request", "note_error"]
