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
one back through Quart's body loop; and, on an HTTP/1.1 connection whose server
offers it (`connection_raw_write`, set by `trio_responses._serve`), a
`response_chunk_write` that frames a chunk of the (chunked) body and writes it
to the socket directly, past hypercorn's stream, h11 and their per-message
state checks: none of them has anything to do for a body chunk once the
response has started. The response still starts and ends through ``send``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
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


RawWrite = Callable[[bytes], Awaitable[None]]

connection_raw_write: ContextVar[RawWrite | None] = ContextVar("connection_raw_write", default=None)
"""Writes bytes to the current connection's socket, in order with the server's own writes.

Set by the server for each plain TCP connection it serves; what it writes goes
on the wire as is, so only a body chunk framed for the protocol in use may go
through it.
"""

response_chunk_write: ContextVar[RawWrite | None] = ContextVar("response_chunk_write", default=None)
"""Writes one chunk of the current HTTP/1.1 response's body (chunked transfer coding).

Only between the response's start and its final ``send``, and only for a body
without a ``Content-Length`` (an SSE stream): h11 frames such a body chunked
for an HTTP/1.1 client. ``None`` for other HTTP versions and servers.
"""


def _chunk_writer(raw: RawWrite) -> RawWrite:
    async def write_chunk(data: bytes) -> None:
        if data:
            try:  # noqa: SIM105 (no context manager per chunk: this is the hot path)
                await raw(b"".join((b"%x\r\n" % len(data), data, b"\r\n")))
            except trio.BusyResourceError:
                pass  # hypercorn is closing this connection: see the module docstring

    return write_chunk


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

        raw = connection_raw_write.get() if scope.get("http_version") == "1.1" else None
        token = response_send.set(guarded_send)
        chunk_token = response_chunk_write.set(None if raw is None else _chunk_writer(raw))
        try:
            await app(scope, receive, guarded_send)
        finally:
            response_chunk_write.reset(chunk_token)
            response_send.reset(token)

    return wrapped
