"""The HTTP API: quart-trio routes over a `ResponsesService`.

Errors, answers and the access line are `common`'s (shared with `create_route`,
which serves ``POST /v1/responses`` ahead of this app). Handlers start nothing
long-lived: they create jobs through the service and subscribe to their event
logs.
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from quart import Response, g, request, websocket
from quart.ctx import RequestContext, WebsocketContext
from quart.typing import ResponseReturnValue
from quart_trio import QuartTrio
from quart_trio.asgi import TrioASGIHTTPConnection
from werkzeug.exceptions import HTTPException

from .._exceptions import (
    AuthenticationError,
    InvalidRequestError,
    ModelNotFoundError,
    ResponsesError,
)
from .._faults import faults_as_exceptions
from .._service import ResponsesService
from ..metrics import CONTENT_TYPE
from ..protocol import errors
from ..protocol.errors import ErrorInfo
from .common import (
    HTTP_ERROR_CODES,
    body_too_large,
    body_too_slow,
    check_response_id,
    create_answer,
    current_route,
    error_json,
    error_response,
    flag,
    has_body,
    integer,
    json_response,
    method_not_allowed,
    owner_for,
    read_json,
    read_json_sized,
    record_request,
    shown,
    sse_response,
    starting_after_param,
    wire_error,
)
from .conversations import add_conversation_routes
from .cors import CorsPolicy
from .dashboard import add_dashboard
from .request_id import REQUEST_ID, request_id_for
from .sse import SSEBody
from .websocket import ResponsesSocket

logger = logging.getLogger("trio_responses.api")


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
        if has_body() and not getattr(g, "body_read", False):
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
            method, _, path = current_route().partition(" ")
            return error_response(method_not_allowed(method, path, app.allowed_methods()))
        if status == 408:
            return error_response(body_too_slow(config.body_timeout_s))
        if status == 404:
            message = f"Unknown route: {current_route()}."
        else:
            message = error.description or error.name
        if status >= 500:
            info = errors.server_error(message, HTTP_ERROR_CODES.get(status, errors.SERVER_ERROR))
        else:
            code = HTTP_ERROR_CODES.get(status, errors.INVALID_REQUEST)
            info = ErrorInfo(errors.INVALID_REQUEST_ERROR, code, message)
        return error_json(info, status)

    @app.errorhandler(Exception)
    async def on_unexpected(error: Exception) -> Response:
        # Also reached from WebSocket handlers, where there is no `request`.
        return error_json(*wire_error(error))

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
        body, size = await read_json_sized()
        answer = await create_answer(service, body, size=size, owner=g.owner)
        if isinstance(answer, SSEBody):
            return sse_response(answer)
        return json_response(answer)

    # A static path: werkzeug matches it before the ``<response_id>`` routes, whatever
    # the order they are registered in.
    @app.post("/v1/responses/input_tokens")
    async def count_input_tokens() -> Response:
        body = await read_json()
        count = await service.count_input_tokens(body, owner=g.owner)
        return json_response({"object": "response.input_tokens", "input_tokens": count})

    @app.post("/v1/responses/compact")
    async def compact_conversation() -> Response:
        body = await read_json()
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
        check_response_id(response_id)
        if flag(request.args.get("stream"), "stream"):
            starting_after = starting_after_param()
            subscription = await service.subscribe(
                response_id, starting_after=starting_after, owner=g.owner, background_only=True
            )
            return sse_response(
                SSEBody(subscription, keepalive_s=config.sse_keepalive_s, metrics=metrics)
            )
        return json_response(await service.retrieve(response_id, owner=g.owner))

    @app.post("/v1/responses/<response_id>/cancel")
    async def cancel_response(response_id: str) -> Response:
        check_response_id(response_id)
        return json_response(await service.cancel(response_id, owner=g.owner))

    @app.delete("/v1/responses/<response_id>")
    async def delete_response(response_id: str) -> Response:
        check_response_id(response_id)
        return json_response(await service.delete(response_id, owner=g.owner))

    @app.get("/v1/responses/<response_id>/input_items")
    async def list_input_items(response_id: str) -> Response:
        check_response_id(response_id)
        args = request.args
        order = args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequestError(
                f"Invalid 'order': {shown(order)}. Use 'asc' or 'desc'.", param="order"
            )
        return json_response(
            await service.list_input_items(
                response_id,
                owner=g.owner,
                after=args.get("after"),
                limit=integer(args.get("limit", "20"), "limit"),
                order=order,  # type: ignore[arg-type]
                include=tuple(args.getlist("include") + args.getlist("include[]")),
            )
        )

    add_conversation_routes(app, service)

    if config.dashboard:
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
