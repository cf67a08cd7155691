"""``POST /v1/responses``: the route `pipeline.Pipeline` serves itself.

Nearly every request a server sees creates a response. The pipeline has done what
every request needs (its id, CORS, the caller's key, the body within its bounds);
`serve_create` decodes the body, creates the response (`common.create_answer`,
which the app's own view for the route shares) and answers: the Response object
as JSON, or its event stream — on HTTP/1.1 framed and written to the connection
directly (`asgi.ChunkedBody`), its head with the first chunk. A client's
disconnect cancels the request, as in quart-trio.
"""

from __future__ import annotations

from functools import partial

import trio
from hypercorn.typing import ASGIReceiveCallable

from .._faults import faults_as_exceptions
from .._offload import offload
from .._service import ResponsesService
from ..protocol.codec import encode_json
from ..protocol.json_body import decode_json_body
from .asgi import response_chunked_body
from .common import SSE_HEADERS, create_answer
from .pipeline import Answer
from .sse import SSEBody

_SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    *((name.lower().encode(), value.encode()) for name, value in SSE_HEADERS.items()),
]


async def serve_create(
    service: ResponsesService, answer: Answer, body: bytes, receive: ASGIReceiveCallable
) -> None:
    """Create a response from the request's ``body`` and send the answer."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
        try:
            with faults_as_exceptions():  # a panic in native code: a 500 like a bug
                decoded = await offload(len(body), partial(decode_json_body, body))
                created = await create_answer(
                    service, decoded, size=len(body), owner=answer.state.owner
                )
        except Exception as error:  # anything but a `ResponsesError` is a bug: a 500
            await answer.error(error)
        else:
            if isinstance(created, SSEBody):
                await _stream(created, answer)
            else:
                await answer.json(200, encode_json(created).encode())
        nursery.cancel_scope.cancel()


async def _stream(body: SSEBody, answer: Answer) -> None:
    """Send ``body`` as the answer; it is closed however that ends."""
    try:
        start = [*_SSE, *answer.headers(200)]
        # On HTTP/1.1, straight to the connection (see `ChunkedBody.start`).
        chunked = response_chunked_body.get()
        if chunked is not None and chunked.start(200, start):
            await body.write_all(answer.send)
            await chunked.end()
            return
        await answer.send_as_is({"type": "http.response.start", "status": 200, "headers": start})
        await body.write_all(answer.send)
        await answer.send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await body.aclose()


async def _cancel_on_disconnect(receive: ASGIReceiveCallable, scope: trio.CancelScope) -> None:
    """Wait for the client's disconnect, then cancel the request (``scope``)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()
