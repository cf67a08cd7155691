"""A connection's socket as the server offers it to the app, past hypercorn's stream.

The server (`_adapters.hypercorn`) sets `connection_raw` for each plain TCP
connection it serves; the app's bodies (`api.asgi.ChunkedBody`) write through it.
Here, below both, so that neither imports the other.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from contextvars import ContextVar
from typing import Protocol

RawWrite = Callable[[bytes], Awaitable[None]]


class RawConnection(Protocol):
    """The current connection's socket, in order with the server's own writes.

    What goes through it goes on the wire as is: only a body chunk framed for
    the protocol in use may.
    """

    async def write(self, data: bytes) -> None:
        """Write all of ``data`` (waiting, with the server's write deadline)."""
        ...

    def write_nowait(self, data: bytes) -> int:
        """Write what the socket takes at once; the number of bytes written.

        0 when it takes nothing now, when another write is in progress, or when
        writing fails (a waiting `write` then reports it). The caller owes the
        rest before anything else is written to the connection.
        """
        ...

    def start_chunked(self, status: int, headers: Sequence[tuple[bytes, bytes]]) -> bytes | None:
        """Start the current response, chunked, in place of its ASGI
        ``http.response.start`` (``headers``: lower-case names, no framing headers).

        Returns the head, for the caller to write before the first chunk; None,
        changing nothing, when the response cannot start this way (send the ASGI
        message instead).
        """
        ...

    async def end_chunked(self, last: bytes) -> None:
        """End the response `start_chunked` began, in place of its final ASGI body
        message: write ``last`` (framed chunks, or nothing) and the end of the body."""
        ...


connection_raw: ContextVar[RawConnection | None] = ContextVar("connection_raw", default=None)
"""Set by the server for each plain TCP connection it serves (`_adapters.hypercorn`)."""


__all__ = ["RawConnection", "RawWrite", "connection_raw"]
