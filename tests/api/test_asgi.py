"""The ASGI wrapper's contract, with hypercorn's failure modes played directly."""

from __future__ import annotations

from typing import Any

import trio

from trio_responses.api.asgi import shield_final_send


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"x", "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def test_final_send_survives_the_request_being_cancelled() -> None:
    delivered: list[str] = []

    async def slow_send(message: Any) -> None:
        await trio.sleep(0.01)
        delivered.append(message["type"])

    async def app(scope: Any, receive: Any, send: Any) -> None:
        with trio.CancelScope() as cancel_scope:
            await send({"type": "http.response.start", "status": 200, "headers": []})
            cancel_scope.cancel()  # quart-trio cancelling on http.disconnect
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    await shield_final_send(app)({"type": "http"}, None, slow_send)  # type: ignore[arg-type]
    assert delivered == ["http.response.start", "http.response.body"]


async def test_a_send_racing_hypercorns_close_is_dropped() -> None:
    async def closing_send(message: Any) -> None:
        await trio.lowlevel.checkpoint()
        raise trio.BusyResourceError("another task is currently sending data on this SocketStream")

    await shield_final_send(_app)({"type": "http"}, None, closing_send)  # type: ignore[arg-type]
