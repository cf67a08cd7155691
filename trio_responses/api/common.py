"""What every route shares: error objects and answers, request reading, owners, the
access log line and metrics, and the answer to a create (the app's route and
`create_route` both serve ``POST /v1/responses``).

Every error becomes OpenAI JSON (``{"error": {message, type, param, code}}``) here:
`wire_error` gives its `ErrorInfo`, `error_body` its JSON; WebSocket mode uses them too.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
from collections.abc import Sequence
from functools import partial
from typing import Any

from quart import Response, has_websocket_context, request, websocket

from .._exceptions import (
    AuthenticationError,
    InvalidRequestError,
    MethodNotAllowedError,
    NotFoundError,
    RequestTimeoutError,
    RequestTooLargeError,
    ResponsesError,
)
from .._logging import RESPONSE_ID, printable, refusal
from .._offload import offload
from .._service import ResponsesService
from ..metrics import Metrics
from ..protocol import errors
from ..protocol.codec import encode_ascii_json, encode_json
from ..protocol.errors import ErrorInfo
from ..protocol.json_body import decode_json_body
from .request_state import note_error
from .sse import SSEBody

logger = logging.getLogger("trio_responses.api")

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

_RESPONSE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""What a response id may look like (ours are ``resp_`` and hex). Anything else names
nothing, and never reaches a store (where it could collide with other keys)."""

HTTP_ERROR_CODES = {
    404: errors.NOT_FOUND,
    415: errors.UNSUPPORTED_MEDIA_TYPE,
    431: errors.REQUEST_HEADER_FIELDS_TOO_LARGE,
}


def owner_of(api_key: str) -> str:
    """The stable, non-reversible owner tag stored with a key's responses."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(encode_json(payload), status=status, mimetype="application/json")


def error_response(error: ResponsesError) -> Response:
    response = error_json(*wire_error(error))
    if isinstance(error, MethodNotAllowedError) and error.allow:
        response.headers["Allow"] = ", ".join(error.allow)
    return response


_INTERNAL_ERROR = errors.server_error(
    "The server had an internal error while processing your request. It has been logged."
)


def wire_error(error: Exception, *, where: str | None = None) -> tuple[ErrorInfo, int]:
    """The `ErrorInfo` and HTTP status of ``error``, for every transport
    (JSON bodies here and in `create_route`, ``error`` events in WebSocket mode).

    An error that is not a `ResponsesError` is a bug: it is logged (with ``where``,
    ``METHOD /path``, else the current Quart request's), and the client gets a
    generic 500 without details.
    """
    if isinstance(error, ResponsesError):
        return error.info, error.status_hint
    logger.error("unhandled error on %s", where or current_route(), exc_info=error)
    return _INTERNAL_ERROR, 500


def body_too_large(max_body_bytes: int) -> RequestTooLargeError:
    """The error of a request body over ``--max-body-bytes``."""
    return RequestTooLargeError(
        f"The request body is larger than this server accepts ({max_body_bytes} bytes)."
    )


def body_too_slow(body_timeout_s: float) -> RequestTimeoutError:
    """The error of a request body that did not arrive within ``--body-timeout``."""
    return RequestTimeoutError(
        f"The request body did not arrive within {body_timeout_s:g} seconds "
        "(--body-timeout). Send the whole body at once."
    )


def method_not_allowed(method: str, path: str, allow: Sequence[str]) -> MethodNotAllowedError:
    """The error of a request whose method the route at ``path`` does not take;
    ``allow``: the methods it does take (its 405's ``Allow`` header)."""
    error = MethodNotAllowedError(f"Method {method} is not allowed on {path}.")
    error.allow = tuple(allow)
    return error


def error_body(error: ErrorInfo) -> bytes:
    """The JSON body of an error response.

    ASCII-escaped: a message quoting a client's string stays encodable whatever it holds.
    """
    return encode_ascii_json({"error": error.error_object()}).encode()


def owner_for(header: str, keys: tuple[bytes, ...]) -> str:
    """The owner tag of the API key in an ``Authorization`` header.

    Raises:
        AuthenticationError: no Bearer key, or not one of ``keys``.
    """
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        raise AuthenticationError(
            "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
        )
    presented = token.strip().encode()
    if not any(hmac.compare_digest(presented, key) for key in keys):
        raise AuthenticationError("Incorrect API key provided.")
    return owner_of(presented.decode())


def record_request(
    metrics: Metrics,
    *,
    method: str,
    route: str | None,
    path: str,
    status: int,
    elapsed: float,
    response_id: str | None = None,
    error: ErrorInfo | None = None,
) -> None:
    """One answered request in the metrics and, at INFO, its log line. ``route``: the
    matched route template (None: no route); ``response_id``: the one the path names
    (else the one the request created, if any); ``error``: the error object answered,
    whose code and param the line names (never the message, which may quote the
    request)."""
    metrics.http_request(route, method, status, elapsed)
    if not logger.isEnabledFor(logging.INFO):
        return
    code = param = None
    said = ""
    if error is not None:
        code, param = error.code, error.param
        said = " " + refusal(error)
    logger.info(
        "%s %s -> %s%s (%.1f ms)",
        method,
        printable(path),
        status,
        said,
        elapsed * 1000,
        extra={
            "method": method,
            "route": route,
            "path": path,
            "status": status,
            "duration_ms": round(elapsed * 1000, 3),
            "response_id": response_id or RESPONSE_ID.get(),
            "error_code": code,
            "param": param,
        },
    )


def current_route() -> str:
    """``METHOD /path`` of the request (or WebSocket) being handled, for messages."""
    if has_websocket_context():
        return f"WEBSOCKET {websocket.path}"
    return f"{request.method} {request.path}"


def error_json(error: ErrorInfo, status: int) -> Response:
    note_error(error)  # for the request's log line (`record_request`)
    return Response(error_body(error), status=status, mimetype="application/json")


def shown(value: str) -> str:
    """A query value as an error message quotes it: escaped, and cut short."""
    return repr(value) if len(value) <= 40 else repr(value[:40]) + "…"


def flag(value: str | None, param: str) -> bool:
    if value is None or value.lower() in ("false", "0", ""):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise InvalidRequestError(f"Invalid '{param}': {shown(value)}. Use true or false.", param=param)


def integer(value: str, param: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidRequestError(
            f"Invalid '{param}': {shown(value)} is not an integer.", param=param
        ) from None


def starting_after_param() -> int:
    """``starting_after`` from the query, else from a ``Last-Event-ID`` header."""
    value = request.args.get("starting_after")
    if value is not None:
        return integer(value, "starting_after")
    last_event_id = request.headers.get("Last-Event-ID")
    if last_event_id:
        return integer(last_event_id, "Last-Event-ID")
    return -1


def sse_response(body: SSEBody) -> Response:
    response = Response(body, mimetype="text/event-stream", headers=SSE_HEADERS)
    response.timeout = None
    return response


def check_response_id(response_id: str) -> None:
    if not _RESPONSE_ID.fullmatch(response_id):
        raise NotFoundError(
            "No response has that id: response ids are letters, digits, '_' and '-' "
            "(like 'resp_…'), at most 128 characters.",
            param="response_id",
        )


async def read_json() -> Any:
    """The request's JSON body, strictly decoded (see `decode_json_body`).

    Large bodies are decoded in a worker thread, so they do not stall the event loop.
    """
    body, _ = await read_json_sized()
    return body


async def read_json_sized() -> tuple[Any, int]:
    """`read_json`, and the body's size in bytes."""
    data = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    return await offload(len(data), partial(decode_json_body, data)), len(data)


async def create_answer(
    service: ResponsesService, body: Any, *, size: int, owner: str | None
) -> SSEBody | dict[str, Any]:
    """Create a response from a request's JSON ``body`` (``size`` bytes): the
    stream to send for ``stream: true``, else the Response object (as created for
    ``background: true``, else once finished). Shared with the app's own route.

    A client that goes away while a foreground response is generated stops it;
    background responses go on.
    """
    handle = await service.create(body, owner=owner, size=size)
    RESPONSE_ID.set(handle.id)  # this request's log line names its response
    try:
        if handle.stream:
            return SSEBody(
                handle.subscribe(),
                keepalive_s=service.config.sse_keepalive_s,
                producer_writes=not service.config.reader_writes,
                on_close=handle.abandon,
                metrics=service.metrics,
            )
        if handle.background:
            return handle.created
        return await handle.wait()
    except BaseException:
        handle.abandon()  # the client went away: stop generating
        raise
