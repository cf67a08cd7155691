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
offers it (`connection_raw`, set by `trio_responses._serve`), a
`response_chunked_body` that frames chunks of the (chunked) body and writes them
to the socket directly, past hypercorn's stream, h11 and their per-message
state checks: none of them has anything to do for a body chunk once the
response has started. A response may also start and end there
(`ChunkedBody.start`, `ChunkedBody.end`: the create route's streams), its head
written with its first chunk and its last chunk with the end of the body;
others start and end through ``send``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any, cast, final

import trio
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGISendCallable,
    ASGISendEvent,
    Scope,
)

from .._raw_connection import RawConnection, connection_raw

FINAL_SEND_TIMEOUT_S = 5.0

response_send: ContextVar[ASGISendCallable | None] = ContextVar("response_send", default=None)
"""The current HTTP request's ASGI ``send`` (guarded), for bodies that write themselves.

Set for the request's whole task tree; ``None`` outside a request served by
`shield_final_send`.
"""


@final
class ChunkedBody:
    """The body of the current HTTP/1.1 response, chunk by chunk (chunked coding).

    Only between the response's start and its final ``send``, and only for a
    body without a ``Content-Length`` (an SSE stream): h11 frames such a body
    chunked for an HTTP/1.1 client, and has nothing else to do for a chunk.
    Not offered for HEAD requests (no body goes on the wire).
    """

    __slots__ = (
        "_connection",
        "_head",
        "_last",
        "_started",
    )

    def __init__(self, connection: RawConnection) -> None:
        self._connection = connection
        self._head = b""
        """The head of a response `start` began, until the first write takes it."""
        self._last = b""
        """The last chunk (`write_last`) of a response `start` began, for `end` to write."""
        self._started = False

    def start(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> bool:
        """Start the response here, not with an ASGI message (`RawConnection.start_chunked`);
        whether it did. Its head goes with the first chunk written, in one write;
        then end it with `end`, not with the final ASGI body message."""
        head = self._connection.start_chunked(status, headers)
        if head is None:
            return False
        self._head = head
        self._started = True
        return True

    async def end(self) -> None:
        """End the response `start` began: the head if nothing was written, then the
        last chunk. Shielded, with a deadline, as the final ASGI send is
        (`shield_final_send`)."""
        if not self._started:
            raise RuntimeError("end() of a response start() did not begin")
        self._started = False
        last = self._head + self._last
        self._head = self._last = b""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + FINAL_SEND_TIMEOUT_S
            # hypercorn may be closing this connection: see the module docstring.
            with contextlib.suppress(trio.BusyResourceError):
                await self._connection.end_chunked(last)

    async def write_last(self, data: bytes) -> None:
        """Write ``data`` as the body's last chunk: in a response `start` began, `end`
        writes it, with the end of the body (one write); else now, as `write` does."""
        if self._started:
            if data:
                self._last += self.frame(data)
            return
        await self.write(data)

    @staticmethod
    def frame(data: bytes) -> bytes:
        """``data`` as one chunk (``data`` not empty: an empty chunk ends the body)."""
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def write(self, data: bytes) -> None:
        """Write ``data`` as one chunk (nothing if empty)."""
        if data:
            await self.write_framed(self.frame(data))

    async def write_framed(self, framed: bytes) -> None:
        """Write bytes already framed (e.g. the rest of a `write_nowait`)."""
        if self._head:
            framed, self._head = self._head + framed, b""
        try:  # noqa: SIM105 (no context manager per chunk: this is the hot path)
            await self._connection.write(framed)
        except trio.BusyResourceError:
            pass  # hypercorn is closing this connection: see the module docstring

    def write_nowait(self, framed: bytes) -> int:
        """See `RawConnection.write_nowait`; 0 while the head is still to be written
        (the first write, a waiting one, takes it)."""
        if self._head:
            return 0
        return self._connection.write_nowait(framed)


response_chunked_body: ContextVar[ChunkedBody | None] = ContextVar(
    "response_chunked_body", default=None
)
"""The current HTTP/1.1 response's `ChunkedBody`; ``None`` for other HTTP versions
and servers."""


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

        # HTTP/1.1 and a body on the wire: a HEAD response has none (h11 and hypercorn
        # drop what the app sends for it; this path would not).
        chunked = scope.get("http_version") == "1.1" and scope.get("method") != "HEAD"
        raw = connection_raw.get() if chunked else None
        token = response_send.set(guarded_send)
        body_token = response_chunked_body.set(None if raw is None else ChunkedBody(raw))
        try:
            await app(scope, receive, guarded_send)
        finally:
            response_chunked_body.reset(body_token)
            response_send.reset(token)

    return wrapped
