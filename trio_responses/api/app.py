"""The HTTP API: quart-trio routes over a `ResponsesService`.

Every error becomes OpenAI JSON (``{"error": {message, type, param, code}}``) here,
in `wire_error` and `error_body` (`create_route`, which serves ``POST
/v1/responses`` ahead of this app, and WebSocket mode use them too). Handlers start
nothing long-lived: they create jobs through the service and subscribe to their
event logs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from quart import Response, g, has_request_context, has_websocket_context, request, websocket
from quart.ctx import RequestContext, WebsocketContext
from quart.typing import ResponseReturnValue
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException

from .._exceptions import (
    AuthenticationError,
    InvalidRequestError,
    MethodNotAllowedError,
    ModelNotFoundError,
    NotFoundError,
    RequestTimeoutError,
    RequestTooLargeError,
    ResponsesError,
)
from .._faults import faults_as_exceptions
from .._logging import RESPONSE_ID, printable, refusal
from .._offload import offload
from .._service import ResponsesService
from ..metrics import CONTENT_TYPE, Metrics
from ..protocol.json_body import decode_json_body
from ..protocol.sse import encode_json
from .cors import CorsPolicy
from .request_id import REQUEST_ID, request_id_for
from .sse import SSEBody
from .websocket import ResponsesSocket

logger = logging.getLogger("trio_responses.api")

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

_RESPONSE_ID = re.compile(r"[A-Za-z0-9_-]{1,128}")
"""What a response id may look like (ours are ``resp_`` and hex). Anything else names
nothing, and never reaches a store (where it could collide with other keys)."""

_HTTP_ERROR_CODES = {
    404: "not_found",
    415: "unsupported_media_type",
    431: "request_header_fields_too_large",
}


def owner_of(api_key: str) -> str:
    """The stable, non-reversible owner tag stored with a key's responses."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(encode_json(payload), status=status, mimetype="application/json")


def error_response(error: ResponsesError) -> Response:
    response = _error_json(*wire_error(error))
    if isinstance(error, MethodNotAllowedError) and error.allow:
        response.headers["Allow"] = ", ".join(error.allow)
    return response


_INTERNAL_ERROR: dict[str, str | None] = {
    "message": "The server had an internal error while processing your request. It has been "
    "logged.",
    "type": "server_error",
    "param": None,
    "code": "server_error",
}


def wire_error(error: Exception, *, where: str | None = None) -> tuple[dict[str, str | None], int]:
    """The OpenAI ``error`` object and HTTP status of ``error``, for every transport
    (JSON bodies here and in `create_route`, ``error`` events in WebSocket mode).

    An error that is not a `ResponsesError` is a bug: it is logged (with ``where``,
    ``METHOD /path``, else the current Quart request's), and the client gets a
    generic 500 without details.
    """
    if isinstance(error, ResponsesError):
        return error.to_error_object(), error.status_hint
    logger.error("unhandled error on %s", where or _where(), exc_info=error)
    return dict(_INTERNAL_ERROR), 500


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


def error_body(error: dict[str, str | None]) -> bytes:
    """The JSON body of an error response.

    ASCII-escaped: a message quoting a client's string stays encodable whatever it holds.
    """
    return json.dumps({"error": error}, separators=(",", ":")).encode()


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
    error: dict[str, str | None] | None = None,
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
        code, param = error.get("code"), error.get("param")
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


def _where() -> str:
    """``METHOD /path`` of the request (or WebSocket) being handled, for messages."""
    if has_websocket_context():
        return f"WEBSOCKET {websocket.path}"
    return f"{request.method} {request.path}"


def _error_json(error: dict[str, str | None], status: int) -> Response:
    if has_request_context() or has_websocket_context():
        g.error = error  # for the request's log line (`record_request`)
    return Response(error_body(error), status=status, mimetype="application/json")


class _HTTPConnection(TrioASGIHTTPConnection):
    """quart-trio's HTTP request handling, in one task fewer.

    quart-trio runs two tasks in a nursery per request: one takes the ASGI
    messages (the body, then a disconnect, which cancels the nursery) and one
    handles the request. Here the handling runs in the task that called the app,
    as the nursery's body: a disconnect cancels it just the same.
    """

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        request = self._create_request_from_scope(send)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.handle_messages, nursery, request, receive)
            await self.handle_request(nursery, request, send)


class _App(QuartTrio):
    """quart-trio's application, with every fault of a view handled as an error.

    Quart turns the exceptions of a view into error responses (here: the
    error JSON, 500 for a bug); a panic in native code is a `BaseException`,
    which would pass by and end the connection's task without an answer.
    """

    async def dispatch_request(
        self, request_context: RequestContext | None = None
    ) -> ResponseReturnValue:
        with faults_as_exceptions():
            return await super().dispatch_request(request_context)

    async def dispatch_websocket(
        self, websocket_context: WebsocketContext | None = None
    ) -> ResponseReturnValue | None:
        with faults_as_exceptions():
            return await super().dispatch_websocket(websocket_context)

    async def make_default_options_response(self) -> Response:
        # Quart lists the methods of every route at the path, WebSocket routes too:
        # ``GET /v1/responses`` is a WebSocket upgrade, which a plain GET gets a 405 for.
        return self.response_class("", headers={"Allow": ", ".join(self.allowed_methods())})

    def allowed_methods(self, path: str | None = None) -> list[str]:
        """The HTTP methods the routes at ``path`` (default: the request's) take,
        WebSocket upgrades aside: what ``OPTIONS`` and a 405's ``Allow`` say."""
        adapter = self.url_map.bind("localhost")
        target = request.path if path is None else path
        allowed = []
        for method in _METHODS:
            try:
                adapter.match(target, method=method, websocket=False)
            except HTTPException:  # no route, another method, a WebSocket route
                continue
            allowed.append(method)
        return [*allowed, "OPTIONS"] if allowed else []


_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def create_app(service: ResponsesService) -> QuartTrio:
    """The quart-trio application serving ``service``. Our server puts
    `create_route.CreateRoute` in front of it (`create_route.create_asgi_app`)."""
    config = service.config
    app = _App("trio_responses")
    app.asgi_http_class = _HTTPConnection
    # Quart cuts any response (SSE included) after 60 s by default.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = config.body_timeout_s
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    keys = tuple(key.encode() for key in config.api_keys)
    cors = CorsPolicy.of(config.cors_allow_origins)
    from .create_route import create_answer  # it uses this module's helpers

    @app.before_request
    async def begin_request() -> Response | None:
        # Registered first, so it runs first: the id is set for every later hook and
        # every log line, and a CORS preflight is answered before authentication
        # (browsers send preflights without credentials).
        g.started = time.perf_counter()
        g.request_id = request_id_for(request.headers.get("X-Request-Id"))
        REQUEST_ID.set(g.request_id)
        if (
            request.method == "OPTIONS"
            and "Access-Control-Request-Method" in request.headers
            and cors.allows(request.headers.get("Origin"))
        ):
            return Response(
                b"",
                status=204,
                headers=cors.preflight_headers(
                    request.headers.get("Access-Control-Request-Headers")
                ),
            )
        return None

    @app.before_websocket
    async def begin_websocket() -> None:
        # Authenticated before the upgrade: a bad key gets an HTTP 401, like a request.
        g.request_id = request_id_for(websocket.headers.get("X-Request-Id"))
        REQUEST_ID.set(g.request_id)
        g.owner = None
        if keys and websocket.path.startswith("/v1/"):
            g.owner = owner_for(websocket.headers.get("Authorization", ""), keys)

    @app.before_request
    async def authenticate() -> None:
        g.owner = None
        if keys and request.path.startswith("/v1/"):
            g.owner = owner_for(request.headers.get("Authorization", ""), keys)

    @app.after_request
    async def finish_response(response: Response) -> Response:
        # One hook rather than one per concern: each is a call through Quart.
        response.headers["x-request-id"] = g.request_id
        if cors.enabled:
            # Whether CORS headers are sent depends on Origin: caches must know.
            response.vary.add("Origin")
            origin = request.headers.get("Origin")
            if origin is not None and cors.allows(origin):
                response.headers.update(cors.response_headers(origin))
        # A reply sent before the body was read (a 401, 404, 405 or 413, a route
        # that takes no body): hypercorn cannot reuse the connection while the rest
        # of the body is unread, and closes it. Say so, rather than let a keep-alive
        # client send its next request into a closing connection.
        if _has_body() and not getattr(g, "body_read", False):
            response.headers["Connection"] = "close"
        log_request(response)
        return response

    def log_request(response: Response) -> None:
        elapsed = time.perf_counter() - getattr(g, "started", time.perf_counter())
        rule = request.url_rule
        view_args = request.view_args or {}
        record_request(
            metrics,
            method=request.method,
            route=rule.rule if rule is not None else None,
            path=request.path,
            status=response.status_code,
            elapsed=elapsed,
            response_id=view_args.get("response_id"),
            error=getattr(g, "error", None),
        )

    @app.errorhandler(ResponsesError)
    async def on_responses_error(error: ResponsesError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def on_http_error(error: HTTPException) -> Response:
        status = error.code or 500
        if status == 413:
            return error_response(body_too_large(config.max_body_bytes))
        if status == 405:
            method, _, path = _where().partition(" ")
            return error_response(method_not_allowed(method, path, app.allowed_methods()))
        if status == 408:
            return error_response(body_too_slow(config.body_timeout_s))
        if status == 404:
            message = f"Unknown route: {_where()}."
        else:
            message = error.description or error.name
        server_side = status >= 500
        return _error_json(
            {
                "message": message,
                "type": "server_error" if server_side else "invalid_request_error",
                "param": None,
                "code": _HTTP_ERROR_CODES.get(
                    status, "server_error" if server_side else "invalid_request"
                ),
            },
            status,
        )

    @app.errorhandler(Exception)
    async def on_unexpected(error: Exception) -> Response:
        # Also reached from WebSocket handlers, where there is no `request`.
        return _error_json(*wire_error(error))

    admin_keys = tuple(key.encode() for key in config.admin_keys)
    metrics = service.metrics

    @app.get("/health")
    async def health() -> Response:
        # Liveness for anyone (load balancers, probes); what runs here, and for whom,
        # only for admins once the server has tenants.
        healthy = service.engine.healthy and service.state.fault() is None
        payload: dict[str, Any] = {"status": "ok" if healthy else "unhealthy"}
        if not keys or _is_admin(admin_keys):
            payload.update(_health_statistics(service))
        return json_response(payload, 200 if healthy else 503)

    @app.get("/metrics")
    async def prometheus_metrics() -> Response:
        # Open without API keys; with them, for admins only (it shows every tenant's load).
        refusal = (
            "/metrics needs an admin key when the server has API keys: send "
            "'Authorization: Bearer ADMIN_KEY' (--admin-key)."
        )
        if keys and not _is_admin(admin_keys, refusal=refusal):
            raise AuthenticationError(refusal)
        return Response(metrics.render(), status=200, content_type=CONTENT_TYPE)

    owned_by = (
        "trio-responses (scripted engine)"
        if service.engine.info.kind == "scripted"
        else "trio-responses"
    )

    def model_card(name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": 0, "owned_by": owned_by}

    @app.get("/v1/models")
    async def list_models() -> Response:
        return json_response(
            {"object": "list", "data": [model_card(name) for name in config.model_names]}
        )

    @app.get("/v1/models/<model_id>")
    async def get_model(model_id: str) -> Response:
        if model_id not in config.model_names:
            raise ModelNotFoundError(f"The model {model_id!r} does not exist.", param="model")
        return json_response(model_card(model_id))

    @app.post("/v1/responses")
    async def create_response() -> Response:
        # Our server answers this route ahead of Quart (`create_route.CreateRoute`);
        # here it serves the app on its own, and gives OPTIONS its ``Allow``.
        body, size = await _read_json_sized()
        answer = await create_answer(service, body, size=size, owner=g.owner)
        if isinstance(answer, SSEBody):
            return _sse(answer)
        return json_response(answer)

    # A static path: werkzeug matches it before the ``<response_id>`` routes, whatever
    # the order they are registered in.
    @app.post("/v1/responses/input_tokens")
    async def count_input_tokens() -> Response:
        body = await _read_json()
        count = await service.count_input_tokens(body, owner=g.owner)
        return json_response({"object": "response.input_tokens", "input_tokens": count})

    @app.post("/v1/responses/compact")
    async def compact_conversation() -> Response:
        body = await _read_json()
        return json_response(await service.compact(body, owner=g.owner))

    @app.websocket("/v1/responses")
    async def responses_websocket() -> None:
        # WebSocket mode: see `ResponsesSocket`.
        socket = ResponsesSocket(
            service,
            websocket._get_current_object(),  # type: ignore[attr-defined]
            owner=g.owner,
            wire_error=wire_error,
        )
        await socket.serve()

    @app.get("/v1/responses/<response_id>")
    async def retrieve_response(response_id: str) -> Response:
        _check_response_id(response_id)
        if _flag(request.args.get("stream"), "stream"):
            starting_after = _starting_after()
            subscription = await service.subscribe(
                response_id, starting_after=starting_after, owner=g.owner, background_only=True
            )
            return _sse(SSEBody(subscription, keepalive_s=config.sse_keepalive_s, metrics=metrics))
        return json_response(await service.retrieve(response_id, owner=g.owner))

    @app.post("/v1/responses/<response_id>/cancel")
    async def cancel_response(response_id: str) -> Response:
        _check_response_id(response_id)
        return json_response(await service.cancel(response_id, owner=g.owner))

    @app.delete("/v1/responses/<response_id>")
    async def delete_response(response_id: str) -> Response:
        _check_response_id(response_id)
        return json_response(await service.delete(response_id, owner=g.owner))

    @app.get("/v1/responses/<response_id>/input_items")
    async def list_input_items(response_id: str) -> Response:
        _check_response_id(response_id)
        args = request.args
        order = args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequestError(
                f"Invalid 'order': {_shown(order)}. Use 'asc' or 'desc'.", param="order"
            )
        return json_response(
            await service.list_input_items(
                response_id,
                owner=g.owner,
                after=args.get("after"),
                limit=_integer(args.get("limit", "20"), "limit"),
                order=order,  # type: ignore[arg-type]
                include=tuple(args.getlist("include") + args.getlist("include[]")),
            )
        )

    from .conversations import add_conversation_routes  # it uses this module's helpers

    add_conversation_routes(app, service)

    if config.dashboard:
        from .dashboard import add_dashboard  # it uses this module's helpers

        add_dashboard(app, service)
    return app


_HEALTH_REFUSAL = (
    "Incorrect admin key provided. /health answers without a key (liveness "
    "only); its statistics need 'Authorization: Bearer ADMIN_KEY' (--admin-key)."
)


def _is_admin(admin_keys: tuple[bytes, ...], *, refusal: str = _HEALTH_REFUSAL) -> bool:
    """Whether the request presents an admin key; no key at all is False.

    Raises:
        AuthenticationError: a key that is not an admin key (API keys included),
            with ``refusal`` as its message.
    """
    header = request.headers.get("Authorization", "").strip()
    if not header:
        return False
    scheme, _, token = header.partition(" ")
    presented = token.strip().encode()
    if (
        scheme.lower() != "bearer"
        or not presented
        or not any(hmac.compare_digest(presented, key) for key in admin_keys)
    ):
        raise AuthenticationError(refusal)
    return True


def _health_statistics(service: ResponsesService) -> dict[str, Any]:
    """What ``/health`` shows admins: the engine, tool servers, store and jobs."""
    info = service.engine.info
    fault = service.state.fault()
    stats = service.statistics()
    return {
        "engine": {
            "kind": info.kind,
            "model": info.model,
            "description": info.description,
            "healthy": service.engine.healthy,
            "statistics": service.engine.statistics(),
        },
        "tool_servers": service.pool.health(),
        "sandbox": service.sandbox.health() if service.sandbox is not None else None,
        "store": {
            "kind": service.state.kind,
            "replica": service.state.control.replica,
            "healthy": fault is None,
            "error": fault,
        },
        "jobs": {
            "running": stats.running_jobs,
            "active": stats.active_jobs,
            "queued": stats.queued_jobs,
            "retained_streams": stats.retained_streams,
            "subscribers": stats.subscribers,
        },
    }


def _shown(value: str) -> str:
    """A query value as an error message quotes it: escaped, and cut short."""
    return repr(value) if len(value) <= 40 else repr(value[:40]) + "…"


def _flag(value: str | None, param: str) -> bool:
    if value is None or value.lower() in ("false", "0", ""):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise InvalidRequestError(
        f"Invalid '{param}': {_shown(value)}. Use true or false.", param=param
    )


def _integer(value: str, param: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidRequestError(
            f"Invalid '{param}': {_shown(value)} is not an integer.", param=param
        ) from None


def _starting_after() -> int:
    """``starting_after`` from the query, else from a ``Last-Event-ID`` header."""
    value = request.args.get("starting_after")
    if value is not None:
        return _integer(value, "starting_after")
    last_event_id = request.headers.get("Last-Event-ID")
    if last_event_id:
        return _integer(last_event_id, "Last-Event-ID")
    return -1


def _sse(body: SSEBody) -> Response:
    response = Response(body, mimetype="text/event-stream", headers=SSE_HEADERS)
    response.timeout = None
    return response


def _check_response_id(response_id: str) -> None:
    if not _RESPONSE_ID.fullmatch(response_id):
        raise NotFoundError(
            "No response has that id: response ids are letters, digits, '_' and '-' "
            "(like 'resp_…'), at most 128 characters.",
            param="response_id",
        )


def _has_body() -> bool:
    """Whether the request came with a body (announced by its headers)."""
    length = request.content_length
    if length is not None:
        return length > 0
    return "chunked" in request.headers.get("Transfer-Encoding", "").lower()


async def _read_json() -> Any:
    """The request's JSON body, strictly decoded (see `decode_json_body`).

    Large bodies are decoded in a worker thread, so they do not stall the event loop.
    """
    body, _ = await _read_json_sized()
    return body


async def _read_json_sized() -> tuple[Any, int]:
    """`_read_json`, and the body's size in bytes."""
    data = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    g.body_read = True
    return await offload(len(data), partial(decode_json_body, data)), len(data)
