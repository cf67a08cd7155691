"""What went wrong, as the wire format says it: one value (`ErrorInfo`) and the codes.

Every error a client sees is an `ErrorInfo` turned into one of three shapes:

- the ``error`` object of an HTTP error body or a WebSocket ``error`` event
  (`ErrorInfo.error_object`): ``{"message", "type", "param", "code"}``;
- a Response's ``error`` field, for a response that ended ``failed``
  (`ErrorInfo.response_error`): ``{"code", "message"}``;
- the fields of an ``error`` event that ends one reader's stream
  (`protocol.builder.stream_error_frame`): ``code``, ``message``, ``param``.

`_exceptions.ResponsesError` and its subclasses carry one (`ResponsesError.info`).
The constants below name the codes the server itself decides (the exception tree's
defaults, the ends of responses that fail, streams that cannot go on); a raise site
that validates a request may name a more precise code of its own (``invalid_value``,
``unknown_parameter``…).

Pure values: imports nothing (the exception tree and every layer use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import final

# -- types (the ``type`` of an error object) ----------------------------------------------

INVALID_REQUEST_ERROR = "invalid_request_error"
AUTHENTICATION_ERROR = "authentication_error"
SERVER_BUSY_ERROR = "server_busy"
SERVER_ERROR_TYPE = "server_error"

# -- codes ---------------------------------------------------------------------------------

INVALID_REQUEST = "invalid_request"
"""The request is malformed (the default of `InvalidRequestError`)."""
INVALID_API_KEY = "invalid_api_key"
NOT_FOUND = "not_found"
MODEL_NOT_FOUND = "model_not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
REQUEST_TIMEOUT = "request_timeout"
REQUEST_TOO_LARGE = "request_too_large"
UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
REQUEST_HEADER_FIELDS_TOO_LARGE = "request_header_fields_too_large"
SERVER_BUSY = "server_busy"
"""429: the server is at capacity."""
RATE_LIMIT_EXCEEDED = "rate_limit_exceeded"
"""429: this API key has as many unfinished responses as one key may have."""
STORE_LIMIT_EXCEEDED = "store_limit_exceeded"
"""413: the response would not fit its owner's share of the store."""
QUOTA_EXCEEDED = "quota_exceeded"
"""400: the file or container would take its owner past a quota (count or bytes)."""
CONTAINER_EXPIRED = "container_expired"
"""400: the container named has expired (its files are gone); create another."""
SERVER_ERROR = "server_error"
"""Something failed on our side (a bug, the engine, a store that stays down)."""
UPSTREAM_UNAVAILABLE = "upstream_unavailable"
"""The remote engine had no upstream inference server to send a turn to."""
UPSTREAM_ERROR = "upstream_error"
"""An upstream inference server refused a turn, failed it, or broke off its stream."""
STORE_UNAVAILABLE = "store_unavailable"
"""503: the state backend failed; the operation may be retried."""
SERVER_SHUTTING_DOWN = "server_shutting_down"
"""503: the server takes no new responses (it is shutting down)."""
SERVER_SHUTDOWN = "server_shutdown"
"""A response the server ended ``failed`` because it shut down first."""
SERVER_RESTARTED = "server_restarted"
"""A response ended ``failed`` because the process running it stopped (recovery)."""
STREAM_LAGGED = "stream_lagged"
"""A stream closed because its reader fell behind the retained events."""
STREAM_EXPIRED = "stream_expired"
"""The events asked for are no longer retained."""


@final
@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """One error as a client sees it. Messages are written for the person reading
    the API response: they say what is wrong and what to do about it."""

    type: str
    """The error object's ``type`` (``invalid_request_error``, ``server_error``…)."""
    code: str
    """Never empty: the wire format's ``code`` is never null."""
    message: str
    param: str | None = None
    """The request field the error is about, if one is."""

    def error_object(self) -> dict[str, str | None]:
        """The ``error`` object of an HTTP error body or a WebSocket ``error`` event."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}

    def response_error(self) -> dict[str, str]:
        """A failed Response's ``error`` field."""
        return {"code": self.code, "message": self.message}


def server_error(message: str, code: str = SERVER_ERROR) -> ErrorInfo:
    """An `ErrorInfo` of type ``server_error``: ours to fix, not the client's."""
    return ErrorInfo(SERVER_ERROR_TYPE, code, message)
