"""quart-trio's HTTP request handling, in one task fewer (`HTTPConnection`).

Tested with quart==0.22.0 and quart-trio==0.12.0 (pinned in pyproject.toml). It
relies on these names, which are not their public API (listed in `RELIES_ON`,
checked against the installed versions by tests/test_pinned_libraries.py):

- ``TrioASGIHTTPConnection``, quart-trio's per-request ASGI handler, subclassed;
- ``TrioASGIHTTPConnection._create_request_from_scope`` (inherited from quart's
  ``ASGIHTTPConnection``: the request object);
- ``TrioASGIHTTPConnection.handle_messages`` (the ASGI messages: the body, then a
  disconnect, which cancels the nursery);
- ``TrioASGIHTTPConnection.handle_request`` (the request handled, its answer sent).
"""

from __future__ import annotations

import trio
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable
from quart_trio.asgi import TrioASGIHTTPConnection

from . import Internal

PINNED = ("quart==0.22.0", "quart-trio==0.12.0")
"""What pyproject.toml pins, and these internals were checked with."""

_CONNECTION = "quart_trio.asgi:TrioASGIHTTPConnection"

RELIES_ON = (
    Internal(_CONNECTION),
    Internal(f"{_CONNECTION}._create_request_from_scope", ("self", "send")),
    Internal(f"{_CONNECTION}.handle_messages", ("self", "nursery", "request", "receive")),
    Internal(f"{_CONNECTION}.handle_request", ("self", "nursery", "request", "send")),
)
"""The names above, for tests/test_pinned_libraries.py."""


class HTTPConnection(TrioASGIHTTPConnection):
    """quart-trio's HTTP request handling, in one task fewer (the app's ``asgi_http_class``).

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


__all__ = ["HTTPConnection"]
