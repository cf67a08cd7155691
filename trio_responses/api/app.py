"""The HTTP API: quart-trio routes over a `ResponsesService`.

This is the only place errors become OpenAI JSON (``{"error": {message, type,
param, code}}``). Handlers start nothing long-lived: they create jobs through
the service and subscribe to their event logs.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import time
from typing import Any

from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .._exceptions import (
    AuthenticationError,
    InvalidRequestError,
    ModelNotFoundError,
    RequestTooLargeError,
    ResponsesError,
)
from .._service import ResponsesService
from ..protocol.sse import encode_json
from .sse import SSEBody

logger = logging.getLogger("trio_responses.api")

SSE_HEADERS = {
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}


def owner_of(api_key: str) -> str:
    """The stable, non-reversible owner tag stored with a key's responses."""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


def json_response(payload: Any, status: int = 200) -> Response:
    return Response(encode_json(payload), status=status, mimetype="application/json")


def error_response(error: ResponsesError) -> Response:
    return json_response({"error": error.to_error_object()}, error.status_hint)


def create_app(service: ResponsesService) -> QuartTrio:
    """The quart-trio application serving ``service``."""
    config = service.config
    app = QuartTrio("trio_responses")
    # Quart cuts any response (SSE included) after 60 s by default.
    app.config["RESPONSE_TIMEOUT"] = None
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    keys = tuple(key.encode() for key in config.api_keys)

    @app.before_request
    async def authenticate() -> None:
        g.started = time.perf_counter()
        g.owner = None
        if not keys or not request.path.startswith("/v1/"):
            return
        header = request.headers.get("Authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationError(
                "You didn't provide an API key. Send it as 'Authorization: Bearer YOUR_KEY'.",
            )
        presented = token.strip().encode()
        if not any(hmac.compare_digest(presented, key) for key in keys):
            raise AuthenticationError("Incorrect API key provided.")
        g.owner = owner_of(presented.decode())

    @app.after_request
    async def log_request(response: Response) -> Response:
        elapsed = time.perf_counter() - getattr(g, "started", time.perf_counter())
        logger.info(
            "%s %s -> %s (%.1f ms)",
            request.method,
            request.path,
            response.status_code,
            elapsed * 1000,
        )
        return response

    @app.errorhandler(ResponsesError)
    async def on_responses_error(error: ResponsesError) -> Response:
        return error_response(error)

    @app.errorhandler(HTTPException)
    async def on_http_error(error: HTTPException) -> Response:
        status = error.code or 500
        if status == 413:
            return error_response(
                RequestTooLargeError(
                    f"The request body is larger than this server accepts "
                    f"({config.max_body_bytes} bytes)."
                )
            )
        if status == 404:
            message = f"Unknown route: {request.method} {request.path}."
            code = "not_found"
        elif status == 405:
            message = f"Method {request.method} is not allowed on {request.path}."
            code = "method_not_allowed"
        else:
            message = error.description or error.name
            code = None
        return json_response(
            {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": None,
                    "code": code,
                }
            },
            status,
        )

    @app.errorhandler(Exception)
    async def on_unexpected(error: Exception) -> Response:
        logger.error("unhandled error on %s %s", request.method, request.path, exc_info=error)
        return json_response(
            {
                "error": {
                    "message": "The server had an internal error while processing your "
                    "request. It has been logged.",
                    "type": "server_error",
                    "param": None,
                    "code": "server_error",
                }
            },
            500,
        )

    @app.get("/health")
    async def health() -> Response:
        info = service.engine.info
        healthy = service.engine.healthy
        stats = service.statistics()
        return json_response(
            {
                "status": "ok" if healthy else "unhealthy",
                "engine": {
                    "kind": info.kind,
                    "model": info.model,
                    "description": info.description,
                    "healthy": healthy,
                    "statistics": service.engine.statistics(),
                },
                "tool_servers": service.pool.health(),
                "store": {"kind": service.state.kind, "replica": service.state.control.replica},
                "jobs": {
                    "running": stats.running_jobs,
                    "active": stats.active_jobs,
                    "queued": stats.queued_jobs,
                    "retained_streams": stats.retained_streams,
                    "subscribers": stats.subscribers,
                },
            },
            200 if healthy else 503,
        )

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
        body = await _read_json()
        handle = await service.create(body, owner=g.owner)
        try:
            if handle.stream:
                # A foreground stream belongs to its client; background jobs go on.
                return _sse(
                    SSEBody(
                        handle.subscribe(),
                        keepalive_s=config.sse_keepalive_s,
                        on_close=handle.abandon,
                    )
                )
            if handle.background:
                return json_response(handle.response)
            return json_response(await handle.wait())
        except BaseException:
            handle.abandon()  # the client went away: stop generating
            raise

    @app.get("/v1/responses/<response_id>")
    async def retrieve_response(response_id: str) -> Response:
        if _flag(request.args.get("stream"), "stream"):
            starting_after = _starting_after()
            subscription = await service.subscribe(
                response_id, starting_after=starting_after, owner=g.owner, background_only=True
            )
            return _sse(SSEBody(subscription, keepalive_s=config.sse_keepalive_s))
        return json_response(await service.retrieve(response_id, owner=g.owner))

    @app.post("/v1/responses/<response_id>/cancel")
    async def cancel_response(response_id: str) -> Response:
        return json_response(await service.cancel(response_id, owner=g.owner))

    @app.delete("/v1/responses/<response_id>")
    async def delete_response(response_id: str) -> Response:
        return json_response(await service.delete(response_id, owner=g.owner))

    @app.get("/v1/responses/<response_id>/input_items")
    async def list_input_items(response_id: str) -> Response:
        args = request.args
        order = args.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequestError(
                f"Invalid 'order': {order!r}. Use 'asc' or 'desc'.", param="order"
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

    return app


def _flag(value: str | None, param: str) -> bool:
    if value is None or value.lower() in ("false", "0", ""):
        return False
    if value.lower() in ("true", "1"):
        return True
    raise InvalidRequestError(f"Invalid '{param}': {value!r}. Use true or false.", param=param)


def _integer(value: str, param: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidRequestError(
            f"Invalid '{param}': {value!r} is not an integer.", param=param
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


async def _read_json() -> Any:
    data = await request.get_data(cache=False)
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise InvalidRequestError(
            "We could not parse the JSON body of your request. The API expects a JSON "
            "object; check that the body is valid JSON and sent with "
            "'Content-Type: application/json'.",
            code="invalid_json",
        ) from None
