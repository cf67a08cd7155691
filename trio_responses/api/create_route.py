"""``POST /v1/responses`` straight from ASGI, ahead of Quart.

Nearly every request a server sees creates a response, and Quart's machinery for
one (its request and app contexts, signals, werkzeug's headers and routing, the
hooks) costs more than the rest of the HTTP stack together: ~450 µs of CPU per
request on the 2-core box, against ~240 µs for hypercorn, h11 and our connection
(`bench/request_cost.py`, see docs/benchmarks.md). `CreateRoute` serves that one
route from the ASGI scope and passes everything else, the WebSocket on the same
path included, to the Quart app.

It behaves as the app's routes do: the request id (``x-request-id``), CORS
headers, authentication, the body's size bound and deadline, errors through
`wire_error`, ``Connection: close`` when a body was left unread, the metrics and
the log line of each request, and a client's disconnect cancelling its request.
What it does with the request is `create_answer`, which the app's own route for it
shares (that one serves the app on its own, and gives ``OPTIONS`` its ``Allow``).
"""

from __future__ import annotations

import time
from functools import partial
from typing import final

import trio
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGISendCallable,
    HTTPScope,
    Scope,
)

from .._faults import faults_as_exceptions
from .._offload import offload
from .._service import ResponsesService
from ..protocol.codec import encode_json
from ..protocol.errors import ErrorInfo
from ..protocol.json_body import decode_json_body
from .app import create_app
from .asgi import response_chunked_body
from .common import (
    SSE_HEADERS,
    body_too_large,
    body_too_slow,
    create_answer,
    error_body,
    method_not_allowed,
    owner_for,
    record_request,
    wire_error,
)
from .cors import CorsPolicy
from .request_id import REQUEST_ID, request_id_for
from .sse import SSEBody

PATH = "/v1/responses"
ALLOW = ("POST", "OPTIONS")
"""The HTTP methods of the route (its WebSocket upgrade is a GET, but no plain GET)."""

_JSON = (b"content-type", b"application/json")
_SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    *((name.lower().encode(), value.encode()) for name, value in SSE_HEADERS.items()),
]


def create_asgi_app(service: ResponsesService) -> ASGIFramework:
    """The whole HTTP and WebSocket API of ``service``: `CreateRoute` ahead of the
    Quart app (`create_app`)."""
    return CreateRoute(service, create_app(service))


@final
class _Request:
    """What the route needs of one request's scope."""

    __slots__ = ("authorization", "chunked", "content_length", "origin", "request_id")

    def __init__(self, scope: HTTPScope) -> None:
        self.authorization = ""
        self.content_length: int | None = None
        self.chunked = False
        self.origin: str | None = None
        client_id: str | None = None
        seen: set[bytes] = set()
        for raw_name, raw_value in scope["headers"]:
            name = raw_name.lower()
            if name in seen:  # the first of repeated headers counts, as in Quart
                continue
            seen.add(name)
            if name == b"authorization":
                self.authorization = raw_value.decode("latin-1")
            elif name == b"content-length":
                # h11 has checked it is one decimal number.
                self.content_length = int(raw_value)
            elif name == b"transfer-encoding":
                self.chunked = b"chunked" in raw_value.lower()
            elif name == b"origin":
                self.origin = raw_value.decode("latin-1")
            elif name == b"x-request-id":
                client_id = raw_value.decode("latin-1")
        self.request_id = request_id_for(client_id)

    @property
    def has_body(self) -> bool:
        """Whether the request announced a body (see `create_app`'s hook)."""
        if self.content_length is not None:
            return self.content_length > 0
        return self.chunked


@final
class CreateRoute:
    """ASGI app: ``POST /v1/responses`` here, the rest to ``app`` (see the module)."""

    def __init__(self, service: ResponsesService, app: ASGIFramework) -> None:
        self._service = service
        self._app = app
        config = service.config
        self._keys = tuple(key.encode() for key in config.api_keys)
        self._cors = CorsPolicy.of(config.cors_allow_origins)
        self._max_body = config.max_body_bytes
        self._body_timeout_s = config.body_timeout_s

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if (
            scope["type"] != "http"
            or scope["path"] != PATH
            or scope["method"] == "OPTIONS"  # CORS preflights and ``Allow``: the app's
            or scope.get("root_path")  # mounted under a prefix: the app reads it
        ):
            await self._app(scope, receive, send)
            return
        await self._serve(scope, receive, send)

    async def _serve(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        started = time.perf_counter()
        request = _Request(scope)
        REQUEST_ID.set(request.request_id)
        method = scope["method"]
        body_read = False
        stream: SSEBody | None = None
        refusal: ErrorInfo | None = None
        async with trio.open_nursery() as nursery:
            try:
                # Authenticated first, as the app's hook does: without a key, any
                # method gets the 401.
                owner = owner_for(request.authorization, self._keys) if self._keys else None
                if method != "POST":
                    raise method_not_allowed(method, PATH, ALLOW)
                data = await self._read_body(request, receive)
                if data is None:
                    return  # the client went away: nobody to answer
                body_read = True
                # As in quart-trio, the client's disconnect cancels the request.
                nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
                with faults_as_exceptions():  # a panic in native code: a 500 like a bug
                    decoded = await offload(len(data), partial(decode_json_body, data))
                    answer = await create_answer(
                        self._service, decoded, size=len(data), owner=owner
                    )
                if isinstance(answer, SSEBody):
                    stream = answer
                else:
                    status, payload = 200, encode_json(answer).encode()
            except Exception as error:  # anything but a `ResponsesError` is a bug: a 500
                wire, status = wire_error(error, where=f"{method} {PATH}")
                payload = error_body(wire)
                refusal = wire
            if stream is not None:
                await self._stream(stream, request, send, started)
            else:
                headers = self._headers(request, close=not body_read and request.has_body)
                # Another method matches no route, as in the app.
                self._log(started, method, status, routed=method == "POST", error=refusal)
                headers += [_JSON, (b"content-length", b"%d" % len(payload))]
                if status == 405:
                    headers.append((b"allow", ", ".join(ALLOW).encode()))
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": payload, "more_body": False})
            nursery.cancel_scope.cancel()

    async def _read_body(self, request: _Request, receive: ASGIReceiveCallable) -> bytes | None:
        """The whole body, within ``--body-timeout`` and ``--max-body-bytes``; None if
        the client disconnects first."""
        if request.content_length is not None and request.content_length > self._max_body:
            raise body_too_large(self._max_body)
        chunks: list[bytes] = []
        size = 0
        with trio.move_on_after(self._body_timeout_s) as waiting:
            while True:
                message = await receive()
                if message["type"] != "http.request":
                    return None  # http.disconnect: the client went away
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > self._max_body:
                    raise body_too_large(self._max_body)
                if chunk:
                    chunks.append(chunk)
                if not message.get("more_body", False):
                    break
        if waiting.cancelled_caught:
            raise body_too_slow(self._body_timeout_s)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def _headers(self, request: _Request, *, close: bool) -> list[tuple[bytes, bytes]]:
        """The headers every answer of the route carries (besides its content type)."""
        headers = [(b"x-request-id", request.request_id.encode())]
        if self._cors.enabled:
            # Whether CORS headers are sent depends on Origin: caches must know.
            headers.append((b"vary", b"Origin"))
            if request.origin is not None and self._cors.allows(request.origin):
                headers.extend(
                    (name.lower().encode(), value.encode("latin-1"))
                    for name, value in self._cors.response_headers(request.origin).items()
                )
        if close:
            # Answered before the body was read: hypercorn closes the connection
            # (see `create_app`'s hook); a keep-alive client must not reuse it.
            headers.append((b"connection", b"close"))
        return headers

    async def _stream(
        self, body: SSEBody, request: _Request, send: ASGISendCallable, started: float
    ) -> None:
        """Send ``body`` as the answer; it is closed however that ends."""
        try:
            start = [*_SSE, *self._headers(request, close=False)]
            self._log(started, "POST", 200)
            # On HTTP/1.1, straight to the connection (see `ChunkedBody.start`).
            chunked = response_chunked_body.get()
            if chunked is not None and chunked.start(200, start):
                await body.write_all(send)
                await chunked.end()
                return
            await send({"type": "http.response.start", "status": 200, "headers": start})
            await body.write_all(send)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await body.aclose()

    def _log(
        self,
        started: float,
        method: str,
        status: int,
        *,
        routed: bool = True,
        error: ErrorInfo | None = None,
    ) -> None:
        """The request's metrics and log line (``routed``: whether it matched a
        route, method included; ``error``: the error object it was answered with)."""
        record_request(
            self._service.metrics,
            method=method,
            route=PATH if routed else None,
            path=PATH,
            status=status,
            elapsed=time.perf_counter() - started,
            error=error,
        )


async def _cancel_on_disconnect(receive: ASGIReceiveCallable, scope: trio.CancelScope) -> None:
    """Wait for the client's disconnect, then cancel the request (``scope``)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
