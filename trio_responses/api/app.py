"""The HTTP API: quart-trio routes over a `ResponsesService`, behind the request
pipeline (`pipeline.Pipeline`: request ids, CORS, keys, bodies, the access line).

Errors and answers are `common`'s. Handlers start nothing long-lived: they create
jobs through the service and subscribe to their event logs.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import os
from functools import cached_property
from typing import Any

from hypercorn.typing import ASGIFramework
from quart import Response, request, websocket
from quart.ctx import RequestContext, WebsocketContext
from quart.typing import ResponseReturnValue
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .._adapters.quart_trio import HTTPConnection
from .._exceptions import (
    AuthenticationError,
    InvalidRequestError,
    ModelNotFoundError,
    ResponsesError,
)
from .._faults import faults_as_exceptions
from .._service import ResponsesService
from ..engine.base import upstream_health
from ..metrics import CONTENT_TYPE
from ..protocol import errors
from ..protocol.errors import ErrorInfo
from ..protocol.model_cards import model_list, openai_card
from .common import (
    HTTP_ERROR_CODES,
    check_response_id,
    create_answer,
    error_json,
    error_response,
    flag,
    integer,
    json_response,
    read_json,
    read_json_sized,
    shown,
    sse_response,
    starting_after_param,
    wire_error,
)
from .conversations import add_conversation_routes
from .create_route import serve_create
from .dashboard import add_dashboard
from .files import add_file_routes
from .pipeline import Pipeline, Router
from .request_state import caller
from .sse import SSEBody
from .webhooks import add_webhook_routes
from .websocket import ResponsesSocket

logger = logging.getLogger("trio_responses.api")


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
        allowed = self.router.allowed(request.path)
        return self.response_class("", headers={"Allow": ", ".join(allowed)})

    @cached_property
    def router(self) -> Router:
        """The app's routes, for the pipeline and for ``OPTIONS``."""
        return Router(self.url_map)


def create_asgi_app(service: ResponsesService) -> ASGIFramework:
    """The whole HTTP and WebSocket API of ``service``: the request pipeline
    (`Pipeline`) in front of the Quart app (`create_app`)."""
    app = create_app(service)
    return Pipeline(service, app, app.router, serve_create)


def create_app(service: ResponsesService) -> _App:
    """The quart-trio application of ``service``'s routes. It is served behind the
    request pipeline (`create_asgi_app`), which authenticates, bounds bodies and
    logs for it."""
    config = service.config
    app = _App("trio_responses")
    app.asgi_http_class = HTTPConnection
    # Quart cuts any response (SSE included) after 60 s by default. The body's
    # bounds are the pipeline's, which hands the app a body it has read whole.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["BODY_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = None
    keys = tuple(key.encode() for key in config.api_keys)

    @app.errorhandler(ResponsesError)
    async def on_responses_error(error: ResponsesError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def on_http_error(error: HTTPException) -> Response:
        # Routes, methods and bodies are the pipeline's (404, 405, 408, 413): what
        # reaches here is werkzeug's own refusal of something else.
        status = error.code or 500
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

    @app.get("/v1/models")
    async def list_models() -> Response:
        return json_response(
            model_list(config.model_names, owned_by=owned_by, context_window=config.max_model_len)
        )

    # ``path``: served names may hold slashes (``openai/gpt-oss-120b``).
    @app.get("/v1/models/<path:model_id>")
    async def get_model(model_id: str) -> Response:
        if model_id not in config.model_names:
            raise ModelNotFoundError(f"The model {model_id!r} does not exist.", param="model")
        return json_response(openai_card(model_id, owned_by))

    @app.post("/v1/responses")
    async def create_response() -> Response:
        # The pipeline serves this route itself (`create_route.serve_create`), unless
        # the app is mounted under a prefix; the route gives OPTIONS its ``Allow``.
        body, size = await read_json_sized()
        answer = await create_answer(service, body, size=size, owner=caller())
        if isinstance(answer, SSEBody):
            return sse_response(answer)
        return json_response(answer)

    # A static path: werkzeug matches it before the ``<response_id>`` routes, whatever
    # the order they are registered in.
    @app.post("/v1/responses/input_tokens")
    async def count_input_tokens() -> Response:
        body = await read_json()
        count = await service.count_input_tokens(body, owner=caller())
        return json_response({"object": "response.input_tokens", "input_tokens": count})

    @app.post("/v1/responses/compact")
    async def compact_conversation() -> Response:
        body = await read_json()
        return json_response(await service.compact(body, owner=caller()))

    @app.websocket("/v1/responses")
    async def responses_websocket() -> None:
        # WebSocket mode: see `ResponsesSocket`.
        socket = ResponsesSocket(
            service,
            websocket._get_current_object(),  # type: ignore[attr-defined]
            owner=caller(),
            wire_error=wire_error,
        )
        await socket.serve()

    @app.get("/v1/responses/<response_id>")
    async def retrieve_response(response_id: str) -> Response:
        check_response_id(response_id)
        if flag(request.args.get("stream"), "stream"):
            starting_after = starting_after_param()
            subscription = await service.subscribe(
                response_id, starting_after=starting_after, owner=caller(), background_only=True
            )
            return sse_response(
                SSEBody(
                    subscription,
                    keepalive_s=config.sse_keepalive_s,
                    metrics=metrics,
                    producer_writes=not config.reader_writes,
                )
            )
        return json_response(await service.retrieve(response_id, owner=caller()))

    @app.post("/v1/responses/<response_id>/cancel")
    async def cancel_response(response_id: str) -> Response:
        check_response_id(response_id)
        return json_response(await service.cancel(response_id, owner=caller()))

    @app.delete("/v1/responses/<response_id>")
    async def delete_response(response_id: str) -> Response:
        check_response_id(response_id)
        return json_response(await service.delete(response_id, owner=caller()))

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
                owner=caller(),
                after=args.get("after"),
                limit=integer(args.get("limit", "20"), "limit"),
                order=order,  # type: ignore[arg-type]
                include=tuple(args.getlist("include") + args.getlist("include[]")),
            )
        )

    add_conversation_routes(app, service)
    add_file_routes(app, service)
    add_webhook_routes(app, service)

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
    """What ``/health`` shows admins: this process (its `Config.worker_id`, its pid),
    the engine, tool servers, store and jobs."""
    info = service.engine.info
    fault = service.state.fault()
    stats = service.statistics()
    return {
        "worker": {"id": service.config.worker_id, "pid": os.getpid()},
        "engine": {
            "kind": info.kind,
            "model": info.model,
            "description": info.description,
            "healthy": service.engine.healthy,
            "statistics": service.engine.statistics(),
            "upstreams": [
                dataclasses.asdict(upstream) for upstream in upstream_health(service.engine)
            ],
        },
        "tool_servers": service.pool.health(),
        "sandbox": service.sandbox.health() if service.sandbox is not None else None,
        "containers": (
            service.files.runtime.health() if service.files.runtime is not None else None
        ),
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
