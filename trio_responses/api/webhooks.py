"""The HTTP routes of the webhook endpoints API (``/v1/webhook_endpoints…``).

Thin handlers over `ResponsesService.webhooks` (`webhooks.endpoints.WebhooksAPI`),
registered by `create_app` with `add_webhook_routes`; the caller's owner scopes
every operation. These are the paths ``client.webhooks`` calls (the SDK's base
URL ends in ``/v1``).
"""

from __future__ import annotations

from functools import partial
from typing import Any

from quart import Response, request
from quart_trio import QuartTrio

from .._offload import offload
from .._service import ResponsesService
from ..protocol.json_body import decode_json_body
from .common import integer, json_response
from .request_state import caller


def add_webhook_routes(app: QuartTrio, service: ResponsesService) -> None:
    """Register the ``/v1/webhook_endpoints`` and ``/v1/webhook_event_types`` routes."""
    webhooks = service.webhooks

    @app.post("/v1/webhook_endpoints")
    async def create_webhook_endpoint() -> Response:
        return json_response(await webhooks.create(await _json_body(), owner=caller()))

    @app.get("/v1/webhook_endpoints")
    async def list_webhook_endpoints() -> Response:
        args = request.args
        return json_response(
            await webhooks.list_endpoints(
                owner=caller(),
                after=args.get("after"),
                limit=integer(args.get("limit", "20"), "limit"),
            )
        )

    @app.get("/v1/webhook_endpoints/<endpoint_id>")
    async def retrieve_webhook_endpoint(endpoint_id: str) -> Response:
        return json_response(await webhooks.retrieve(endpoint_id, owner=caller()))

    @app.post("/v1/webhook_endpoints/<endpoint_id>")
    async def update_webhook_endpoint(endpoint_id: str) -> Response:
        body = await _json_body()
        return json_response(await webhooks.update(endpoint_id, body, owner=caller()))

    @app.delete("/v1/webhook_endpoints/<endpoint_id>")
    async def delete_webhook_endpoint(endpoint_id: str) -> Response:
        return json_response(await webhooks.delete(endpoint_id, owner=caller()))

    @app.post("/v1/webhook_endpoints/<endpoint_id>/rotate_secret")
    async def rotate_webhook_secret(endpoint_id: str) -> Response:
        body = await _json_body(empty_ok=True)
        return json_response(await webhooks.rotate_secret(endpoint_id, body, owner=caller()))

    @app.post("/v1/webhook_endpoints/<endpoint_id>/test")
    async def test_webhook_endpoint(endpoint_id: str) -> Response:
        body = await _json_body()
        return json_response(await webhooks.test(endpoint_id, body, owner=caller()))

    @app.get("/v1/webhook_event_types")
    async def webhook_event_types() -> Response:
        return json_response(webhooks.event_types())


async def _json_body(*, empty_ok: bool = False) -> Any:
    data = await request.get_data(cache=False, as_text=False, parse_form_data=False)
    if empty_ok and not data.strip():
        return None
    return await offload(len(data), partial(decode_json_body, data))
