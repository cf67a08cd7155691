"""The one request pipeline: what every HTTP request and WebSocket goes through.

`Pipeline` is an ASGI middleware in front of the Quart app (`app.create_app`),
and the only place for what all routes share:

- the request id (``x-request-id``: the client's when sane, else a new one), set
  for every log line of the request and of the jobs it starts;
- CORS: preflights answered (before authentication: browsers send them without
  credentials), ``Vary: Origin`` and the allow headers on every answer;
- authentication of the ``/v1/`` routes (a WebSocket before its upgrade);
- routing against the app's own URL map, so that an unknown route (404) or method
  (405, with ``Allow``) is refused before any body is read;
- the body, read whole within ``--max-body-bytes`` and ``--body-timeout`` (413,
  408) and handed to the app in one message; ``Connection: close`` on an answer
  sent before a body was read (hypercorn will not reuse that connection);
- error mapping: every refusal and fault becomes the OpenAI error JSON through
  `common.wire_error` (the app's error handlers use it too);
- the access log line and the request metrics, once per request, when its
  answer starts.

What a route does stays the app's: Quart dispatches every route, except that
``POST /v1/responses`` — nearly every request a server sees — goes straight to
`create_route.serve_create` here. Quart's request machinery (its contexts,
werkzeug's request object, signals) costs more per request than hypercorn and
h11 together (``bench/request_cost.py``); the create route needs none of it.
The app's own view for that route stays, for routing, ``OPTIONS`` and ``Allow``.

`current_request` gives a view what the pipeline learned (the caller's owner);
views and error handlers record the error they answer with there, for the log line.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, final

import trio
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPScope,
    Scope,
    WebsocketScope,
)
from werkzeug.exceptions import HTTPException, MethodNotAllowed, NotFound
from werkzeug.routing import Map, RequestRedirect, WebsocketMismatch

from .._exceptions import MethodNotAllowedError, NotFoundError, ResponsesError
from .._faults import faults_as_exceptions
from .._service import ResponsesService
from .common import (
    body_too_large,
    body_too_slow,
    error_body,
    method_not_allowed,
    owner_for,
    record_request,
    wire_error,
)
from .cors import CorsPolicy
from .request_id import REQUEST_ID, request_id_for
from .request_state import RequestState, current_request, enter_request

CREATE_PATH = "/v1/responses"
"""The route served here rather than by Quart (``POST`` only)."""

_JSON = (b"content-type", b"application/json")

CreateHandler = Callable[
    ["ResponsesService", "Answer", bytes, ASGIReceiveCallable], Awaitable[None]
]
"""Serves ``POST /v1/responses`` (`create_route.serve_create`): the service, the
answer, the body read, and the connection's ``receive`` (for its disconnect)."""
_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


@final
class _Head:
    """The headers the pipeline reads, from one pass over the scope's."""

    __slots__ = (
        "authorization",
        "chunked",
        "content_length",
        "origin",
        "preflight_headers",
        "preflight_method",
        "request_id",
    )

    def __init__(self, scope: HTTPScope | WebsocketScope) -> None:
        self.authorization = ""
        self.content_length: int | None = None
        self.chunked = False
        self.origin: str | None = None
        self.preflight_method: str | None = None
        self.preflight_headers: str | None = None
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
            elif name == b"access-control-request-method":
                self.preflight_method = raw_value.decode("latin-1")
            elif name == b"access-control-request-headers":
                self.preflight_headers = raw_value.decode("latin-1")
        self.request_id = request_id_for(client_id)

    @property
    def has_body(self) -> bool:
        """Whether the request announced a body."""
        if self.content_length is not None:
            return self.content_length > 0
        return self.chunked


@final
class Router:
    """The app's routes, matched ahead of the app (its werkzeug URL map)."""

    __slots__ = ("_adapter",)

    def __init__(self, url_map: Map) -> None:
        self._adapter = url_map.bind("localhost")

    def match(self, method: str, path: str) -> tuple[str, Mapping[str, Any]] | None:
        """The template and arguments of the route ``method path`` takes; None when
        the app must see the request itself (a redirect to the canonical path).

        Raises:
            NotFoundError: no route at ``path``.
            MethodNotAllowedError: routes at ``path``, none for ``method`` (with
                ``allow``, what they take).
        """
        try:
            rule, arguments = self._adapter.match(
                path, method=method, return_rule=True, websocket=False
            )
        except RequestRedirect:
            return None
        except (MethodNotAllowed, WebsocketMismatch):
            raise method_not_allowed(method, path, self.allowed(path)) from None
        except NotFound:
            raise NotFoundError(f"Unknown route: {method} {path}.") from None
        return rule.rule, arguments

    def allowed(self, path: str) -> list[str]:
        """The HTTP methods the routes at ``path`` take, WebSocket upgrades aside:
        what ``OPTIONS`` and a 405's ``Allow`` say."""
        allowed = []
        for method in _METHODS:
            try:
                self._adapter.match(path, method=method, websocket=False)
            except HTTPException:  # no route, another method, a WebSocket route
                continue
            allowed.append(method)
        return [*allowed, "OPTIONS"] if allowed else []


@final
class Answer:
    """The answer to one HTTP request: every start goes through `start`, which adds
    the headers every answer carries and writes the request's log line."""

    __slots__ = (
        "_close",
        "_cors",
        "_head",
        "_metrics",
        "_send",
        "_worker_header",
        "started",
        "state",
    )

    def __init__(
        self,
        pipeline: Pipeline,
        state: RequestState,
        head: _Head,
        send: ASGISendCallable,
    ) -> None:
        self._cors = pipeline.cors
        self._metrics = pipeline.service.metrics
        self._worker_header = pipeline.worker_header
        self._head = head
        self._send = send
        self.state = state
        self.started = False

    def headers(self, status: int) -> list[tuple[bytes, bytes]]:
        """The headers of every answer (besides its own), and its log line: call once,
        as the answer starts."""
        state = self.state
        self.started = True
        record_request(
            self._metrics,
            method=state.method,
            route=state.route,
            path=state.path,
            status=status,
            elapsed=time.perf_counter() - state.started,
            response_id=state.response_id,
            error=state.error,
        )
        headers = [(b"x-request-id", state.request_id.encode())]
        if self._worker_header is not None:
            headers.append(self._worker_header)
        cors = self._cors
        if cors.enabled:
            # Whether CORS headers are sent depends on Origin: caches must know.
            headers.append((b"vary", b"Origin"))
            origin = self._head.origin
            if origin is not None and cors.allows(origin):
                headers.extend(
                    (name.lower().encode(), value.encode("latin-1"))
                    for name, value in cors.response_headers(origin).items()
                )
        if not state.body_read and self._head.has_body:
            # Answered before the body was read: hypercorn cannot reuse the
            # connection while the rest of the body is unread, and closes it. Say
            # so, rather than let a keep-alive client send its next request into a
            # closing connection.
            headers.append((b"connection", b"close"))
        return headers

    async def send(self, message: ASGISendEvent) -> None:
        """The app's ``send``: its start gets the headers of every answer."""
        if message["type"] == "http.response.start":
            status = message["status"]
            message = {
                "type": "http.response.start",
                "status": status,
                "headers": [*message.get("headers", ()), *self.headers(status)],
                "trailers": message.get("trailers", False),
            }
        await self._send(message)

    async def send_as_is(self, message: ASGISendEvent) -> None:
        """Send ``message`` as it is (a start that has the `headers` already)."""
        await self._send(message)

    async def whole(
        self, status: int, headers: Sequence[tuple[bytes, bytes]], body: bytes = b""
    ) -> None:
        """Answer with ``body`` (``headers``: its own, framing aside)."""
        headers = [
            *self.headers(status),
            *headers,
            (b"content-length", b"%d" % len(body)),
        ]
        await self._send({"type": "http.response.start", "status": status, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def json(
        self, status: int, payload: bytes, extra: Sequence[tuple[bytes, bytes]] = ()
    ) -> None:
        """Answer with the JSON ``payload``."""
        await self.whole(status, [_JSON, *extra], payload)

    async def error(self, error: Exception) -> None:
        """Answer with ``error`` as OpenAI error JSON (a bug: a logged 500)."""
        state = self.state
        wire, status = wire_error(error, where=f"{state.method} {state.path}")
        state.error = wire
        extra: list[tuple[bytes, bytes]] = []
        if isinstance(error, MethodNotAllowedError) and error.allow:
            extra.append((b"allow", ", ".join(error.allow).encode()))
        await self.json(status, error_body(wire), extra)


@final
class Pipeline:
    """ASGI app: the pipeline (see the module) in front of ``app``."""

    __slots__ = (
        "_app",
        "_body_timeout_s",
        "_create",
        "_keys",
        "_max_body",
        "_router",
        "cors",
        "service",
        "worker_header",
    )

    def __init__(
        self,
        service: ResponsesService,
        app: ASGIFramework,
        router: Router,
        create: CreateHandler,
    ) -> None:
        self.service = service
        self._app = app
        self._router = router
        self._create = create
        config = service.config
        self._keys = tuple(key.encode() for key in config.api_keys)
        self.cors = CorsPolicy.of(config.cors_allow_origins)
        self._max_body = config.max_body_bytes
        self._body_timeout_s = config.body_timeout_s
        self.worker_header: tuple[bytes, bytes] | None = (
            None if config.worker_id is None else (b"x-worker-id", config.worker_id.encode())
        )
        """``x-worker-id`` for every answer, when the server has a `Config.worker_id`."""

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        else:  # lifespan
            await self._app(scope, receive, send)

    async def _http(
        self, scope: HTTPScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        head = _Head(scope)
        method = scope["method"]
        path = _route_path(scope)
        state = RequestState(head.request_id, method, path)
        enter_request(state)
        REQUEST_ID.set(state.request_id)
        answer = Answer(self, state, head, send)
        try:
            with faults_as_exceptions():  # a panic in native code: a 500 like a bug
                preflight = method == "OPTIONS" and head.preflight_method is not None
                if preflight and self.cors.allows(head.origin):
                    await self._preflight(answer, head)
                    return
                create = method == "POST" and path == CREATE_PATH
                unrouted: ResponsesError | None = None
                if create:
                    state.route = CREATE_PATH
                else:
                    try:
                        matched = self._router.match(method, path)
                    except ResponsesError as error:
                        unrouted = error
                    else:
                        if matched is not None:
                            state.route, arguments = matched
                            response_id = arguments.get("response_id")
                            if isinstance(response_id, str):
                                state.response_id = response_id
                # Authenticated before the route is refused: without a key, any
                # method on any /v1/ path gets the 401.
                if self._keys and path.startswith("/v1/"):
                    state.owner = owner_for(head.authorization, self._keys)
                if unrouted is not None:
                    raise unrouted
                body = b""
                if head.has_body:
                    data = await self._read_body(head, receive)
                    if data is None:
                        return  # the client went away: nobody to answer
                    body = data
                state.body_read = True
            if create:
                await self._create(self.service, answer, body, receive)
            else:
                await self._app(scope, _Replay(body, receive), answer.send)
        except Exception as error:  # refused here, or a bug the app let through
            if answer.started:
                raise  # too late for an answer: hypercorn ends the connection
            await answer.error(error)

    async def _preflight(self, answer: Answer, head: _Head) -> None:
        allowed = self.cors.preflight_headers(head.preflight_headers)
        await answer.whole(
            204,
            [(name.lower().encode(), value.encode("latin-1")) for name, value in allowed.items()],
        )

    async def _read_body(self, head: _Head, receive: ASGIReceiveCallable) -> bytes | None:
        """The whole body, within ``--body-timeout`` and ``--max-body-bytes``; None if
        the client disconnects first."""
        if head.content_length is not None and head.content_length > self._max_body:
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

    async def _websocket(
        self, scope: WebsocketScope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        head = _Head(scope)
        path = _route_path(scope)
        state = RequestState(head.request_id, "WEBSOCKET", path)
        enter_request(state)
        REQUEST_ID.set(state.request_id)
        try:
            # Authenticated before the upgrade: a bad key gets an HTTP 401, like a request.
            if self._keys and path.startswith("/v1/"):
                state.owner = owner_for(head.authorization, self._keys)
        except ResponsesError as error:
            await self._refuse_upgrade(scope, receive, send, error)
            return
        await self._app(scope, receive, send)

    async def _refuse_upgrade(
        self,
        scope: WebsocketScope,
        receive: ASGIReceiveCallable,
        send: ASGISendCallable,
        error: ResponsesError,
    ) -> None:
        """Refuse a WebSocket with ``error`` as an HTTP answer (the ASGI extension
        hypercorn offers), else by closing it."""
        wire, status = wire_error(error)
        if "websocket.http.response" not in scope.get("extensions", {}):
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008, "reason": ""})
            return
        payload = error_body(wire)
        headers = [
            (b"x-request-id", current_request().request_id.encode()),
            _JSON,
            (b"content-length", b"%d" % len(payload)),
        ]
        await send({"type": "websocket.http.response.start", "status": status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": payload, "more_body": False})


@final
class _Replay:
    """The app's ``receive``: the body the pipeline read, as one message; then the
    connection's own messages (a disconnect)."""

    __slots__ = ("_body", "_receive")

    def __init__(self, body: bytes, receive: ASGIReceiveCallable) -> None:
        self._body: bytes | None = body
        self._receive = receive

    async def __call__(self) -> ASGIReceiveEvent:
        body = self._body
        if body is None:
            return await self._receive()
        self._body = None
        return {"type": "http.request", "body": body, "more_body": False}


def _route_path(scope: HTTPScope | WebsocketScope) -> str:
    """The path the app routes on: the scope's, less the prefix it is mounted under."""
    path = scope["path"]
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        return path[len(root) :] or "/"
    return path


__all__ = [
    "CREATE_PATH",
    "Answer",
    "Pipeline",
    "Router",
]
