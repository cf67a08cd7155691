"""The HTTP routes of the Conversations API (``/v1/conversations…``).

Thin handlers over `ResponsesService.conversations` (``_conversations.py``),
registered by `create_app` with `add_conversation_routes`. The caller's owner
(``caller()``, set by authentication) scopes every operation; errors reach the
wire through the application's error handlers.
"""

from __future__ import annotations

from typing import Literal

from quart import Response, request
from quart_trio import QuartTrio

from .._exceptions import InvalidRequestError
from .._service import ResponsesService
from ..protocol.request import check_includes
from .common import integer, json_response, read_json, shown
from .request_state import caller


def add_conversation_routes(app: QuartTrio, service: ResponsesService) -> None:
    """Register the ``/v1/conversations`` routes on ``app``."""
    conversations = service.conversations

    @app.post("/v1/conversations")
    async def create_conversation() -> Response:
        body = await read_json()
        return json_response(await conversations.create(body, owner=caller()))

    @app.get("/v1/conversations/<conversation_id>")
    async def retrieve_conversation(conversation_id: str) -> Response:
        return json_response(await conversations.retrieve(conversation_id, owner=caller()))

    @app.post("/v1/conversations/<conversation_id>")
    async def update_conversation(conversation_id: str) -> Response:
        body = await read_json()
        return json_response(await conversations.update(conversation_id, body, owner=caller()))

    @app.delete("/v1/conversations/<conversation_id>")
    async def delete_conversation(conversation_id: str) -> Response:
        return json_response(await conversations.delete(conversation_id, owner=caller()))

    @app.get("/v1/conversations/<conversation_id>/items")
    async def list_conversation_items(conversation_id: str) -> Response:
        args = request.args
        return json_response(
            await conversations.list_items(
                conversation_id,
                owner=caller(),
                after=args.get("after"),
                limit=integer(args.get("limit", "20"), "limit"),
                order=_order(args.get("order", "desc")),
                include=_include(),
            )
        )

    @app.post("/v1/conversations/<conversation_id>/items")
    async def create_conversation_items(conversation_id: str) -> Response:
        body = await read_json()
        return json_response(
            await conversations.add_items(conversation_id, body, owner=caller(), include=_include())
        )

    @app.get("/v1/conversations/<conversation_id>/items/<item_id>")
    async def retrieve_conversation_item(conversation_id: str, item_id: str) -> Response:
        _include()  # accepted (and checked) as OpenAI does; nothing is left out here
        return json_response(
            await conversations.retrieve_item(conversation_id, item_id, owner=caller())
        )

    @app.delete("/v1/conversations/<conversation_id>/items/<item_id>")
    async def delete_conversation_item(conversation_id: str, item_id: str) -> Response:
        return json_response(
            await conversations.delete_item(conversation_id, item_id, owner=caller())
        )


def _order(value: str) -> Literal["asc", "desc"]:
    if value == "asc":
        return "asc"
    if value == "desc":
        return "desc"
    raise InvalidRequestError(
        f"Invalid 'order': {shown(value)}. Use 'asc' or 'desc'.", param="order"
    )


def _include() -> tuple[str, ...]:
    """``include`` from the query (``include=…`` or ``include[]=…``), checked."""
    values = tuple(request.args.getlist("include") + request.args.getlist("include[]"))
    check_includes(values)
    return values
