"""The error tree. Nothing here knows about HTTP; `api/` turns these into JSON.

Each error carries the hints the wire format needs (status, type, code, param)::

    ResponsesError                      status_hint  type                    code
    ├── InvalidRequestError             400          invalid_request_error   invalid_request *
    │   ├── MethodNotAllowedError       405          invalid_request_error   method_not_allowed
    │   └── RequestTimeoutError         408          invalid_request_error   request_timeout
    ├── AuthenticationError             401          authentication_error    invalid_api_key
    ├── NotFoundError                   404          invalid_request_error   not_found
    │   └── ModelNotFoundError          404          invalid_request_error   model_not_found
    ├── RequestTooLargeError            413          invalid_request_error   request_too_large
    ├── ServerBusyError                 429          server_busy             server_busy
    ├── ServerError                     500          server_error            server_error
    │   ├── EngineError                 500          server_error            server_error
    │   └── StoreError                  503          server_error            store_unavailable
    └── ShuttingDownError               503          server_error            server_shutting_down

    StartupError                        the server cannot start as configured (the command
                                        prints its message as one line and exits 1)

Every error has a code (the wire format's ``code`` is never null): the class's,
unless the raise site names a more precise one (* ``invalid_value``,
``unknown_parameter``, ``invalid_json``…). Each error is one `ErrorInfo`
(`ResponsesError.info`); the types and the codes above are the constants of
`protocol.errors`.
Messages are written for the person reading the API response: they say what is
wrong and what to do about it.
"""

from __future__ import annotations

from typing import ClassVar

from .protocol import errors
from .protocol.errors import ErrorInfo


class ResponsesError(Exception):
    """Base class of every error this package raises on purpose."""

    status_hint: ClassVar[int] = 500
    error_type: ClassVar[str] = errors.SERVER_ERROR_TYPE
    default_code: ClassVar[str] = errors.SERVER_ERROR

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code: str = code if code is not None else self.default_code

    @property
    def info(self) -> ErrorInfo:
        """The error as the wire format says it."""
        return ErrorInfo(self.error_type, self.code, self.message, self.param)


class InvalidRequestError(ResponsesError):
    """The request is malformed or asks for something we cannot do."""

    status_hint = 400
    error_type = errors.INVALID_REQUEST_ERROR
    default_code = errors.INVALID_REQUEST


class AuthenticationError(ResponsesError):
    """Missing or wrong API key."""

    status_hint = 401
    error_type = errors.AUTHENTICATION_ERROR
    default_code = errors.INVALID_API_KEY


class NotFoundError(ResponsesError):
    """An id that names nothing (or nothing this caller may see)."""

    status_hint = 404
    error_type = errors.INVALID_REQUEST_ERROR
    default_code = errors.NOT_FOUND


class ModelNotFoundError(NotFoundError):
    """The requested model is not served here."""

    default_code = errors.MODEL_NOT_FOUND


class RequestTooLargeError(ResponsesError):
    """The body is larger than ``max_body_bytes``."""

    status_hint = 413
    error_type = errors.INVALID_REQUEST_ERROR
    default_code = errors.REQUEST_TOO_LARGE


class MethodNotAllowedError(InvalidRequestError):
    """The route exists but does not take this HTTP method."""

    status_hint = 405
    default_code = errors.METHOD_NOT_ALLOWED
    allow: tuple[str, ...] = ()
    """The methods the route takes (the answer's ``Allow`` header)."""


class RequestTimeoutError(InvalidRequestError):
    """The client did not send its whole request body in time."""

    status_hint = 408
    default_code = errors.REQUEST_TIMEOUT


class ServerBusyError(ResponsesError):
    """The job queue is full; retry later."""

    status_hint = 429
    error_type = errors.SERVER_BUSY_ERROR
    default_code = errors.SERVER_BUSY


class ServerError(ResponsesError):
    """Something failed on our side."""

    status_hint = 500
    error_type = errors.SERVER_ERROR_TYPE
    default_code = errors.SERVER_ERROR


class EngineError(ServerError):
    """The inference engine failed while producing a response."""


class StoreError(ServerError):
    """The state backend (SQLite file, Redis server) failed; the operation may be retried."""

    status_hint = 503
    default_code = errors.STORE_UNAVAILABLE


class ShuttingDownError(ResponsesError):
    """The server is shutting down and takes no new responses."""

    status_hint = 503
    error_type = errors.SERVER_ERROR_TYPE
    default_code = errors.SERVER_SHUTTING_DOWN


class StartupError(Exception):
    """The server cannot start as configured: a port it cannot bind, an engine that is
    not installed, a vocabulary it cannot load.

    Not a `ResponsesError`: no request caused it. Its message is one line that says
    what is wrong and what to do; ``trio-responses serve`` prints it and exits 1.
    """
