"""ASGI wrapper around the app for two hypercorn/quart-trio interactions.

1. quart-trio cancels the request task on ``http.disconnect``; hypercorn closes
   the connection from inside the app's final ``send()``. When the two race,
   the close is cancelled and the connection stays open (``Connection: close``
   is ignored, idle keep-alive connections are never closed). Sending the final
   body message shielded, with a deadline, lets that close complete.

2. hypercorn's ``TCPServer._close`` calls ``send_eof()`` without the lock its
   data sends hold. When a client hangs up while the app is still sending,
   the app's send meets ``trio.BusyResourceError`` ("another task is currently
   sending data"), which hypercorn logs as an ASGI error. The connection is
   going away and nothing more can be delivered, so such a send is dropped.
   (Upstream: ``_close`` should take ``send_lock``.)

It also publishes the request's guarded ``send`` as `response_send`, so that a
streaming body (`SSEBody`) can write its chunks itself rather than handing each
one back through Quart's body loop.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, cast

import trio
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)

FINAL_SEND_TIMEOUT_S = 5.0

response_send: ContextVar[ASGISendCallable | None] = ContextVar("response_send", default=None)
"""The current HTTP request's ASGI ``send`` (guarded), for bodies that write themselves.

Set for the request's whole task tree; ``None`` outside a request served by
`shield_final_send`.
"""


def shield_final_send(app: ASGIFramework) -> ASGIFramework:
    async def wrapped(scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def guarded_send(message: ASGISendEvent) -> None:
            final = message["type"] == "http.response.body" and not cast(
                dict[str, Any], message
            ).get("more_body", False)
            try:
                if final:
                    with trio.CancelScope(shield=True) as scope_:
                        scope_.deadline = trio.current_time() + FINAL_SEND_TIMEOUT_S
                        await send(message)
                else:
                    await send(message)
            except trio.BusyResourceError:
                pass  # hypercorn is closing this connection: see the module docstring

        token = response_send.set(guarded_send)
        try:
            await app(scope, receive, guarded_send)
        finally:
            response_send.reset(token)

    return wrapped
