"""WebSocket mode of ``/v1/responses``: ``response.create`` events in, stream events out.

One connection runs one response at a time. The client sends a
``response.create`` event (the create body with ``"type": "response.create"``,
without ``stream`` or ``background``); the server answers with the response's
stream events, one JSON text message each (the same JSON as the SSE ``data:``
lines), ending with its terminal event. Then the next ``response.create``.

The connection keeps its last `CACHED_RESPONSES` finished responses (their
input items and output): a ``previous_response_id`` naming one of them
continues from it without the store, so chains work with ``store: false``.
``generate: false`` prepares a response without running the model: it is
answered with ``response.created``, ``response.in_progress`` and a
``response.completed`` with no output, and continuing from it continues from
its input.

Only completed and incomplete responses are kept (a failed or cancelled one
cannot be continued).

Mistakes get an ``error`` event (``{"type": "error", "status", "error":
{message, type, param, code}}``, the HTTP status and error object a create
would get) and the connection stays open. Closing the connection cancels the
response in flight.

Task tree::

    ResponsesSocket.serve          the route's task: receives client events
    └── _respond                   at most one: prepare, start, forward its events
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from functools import partial
from typing import Any, final

import trio
from quart.wrappers import Websocket

from .._exceptions import InvalidRequestError, NotFoundError, ResponsesError, ServerError
from .._faults import faults_as_exceptions
from .._logging import refusal
from .._offload import offload
from .._prepare import PreparedRequest
from .._runner import ResponseHandle
from .._service import ResponsesService
from ..background.event_log import SubscriberLagged
from ..protocol import errors
from ..protocol.builder import ResponseBuilder, request_echo
from ..protocol.codec import encode_ascii_json, frame_data, is_terminal_frame
from ..protocol.errors import ErrorInfo
from ..protocol.ids import new_id
from ..protocol.json_body import decode_json_body
from ..store.base import StoredResponse

logger = logging.getLogger("trio_responses.api")

CACHED_RESPONSES = 8
"""Finished responses a connection keeps for ``previous_response_id`` (the newest)."""

WireError = Callable[[Exception], tuple[ErrorInfo, int]]
"""The `ErrorInfo` and HTTP status of an error (`api.common.wire_error`)."""


@final
class ResponsesSocket:
    """One accepted WebSocket connection of ``/v1/responses`` (see the module docstring)."""

    def __init__(
        self,
        service: ResponsesService,
        websocket: Websocket,
        *,
        owner: str | None,
        wire_error: WireError,
    ) -> None:
        self._service = service
        self._websocket = websocket
        self._owner = owner
        self._wire_error = wire_error
        self._cache: OrderedDict[str, StoredResponse] = OrderedDict()
        # The token of the response in flight (None: the connection takes the next
        # response.create). A response releases the connection only while it still
        # holds it, so a late release never frees a successor's slot.
        self._current: object | None = None
        self._responses = 0
        # Held for each batch of messages, so the events of one response and the
        # error events of the receiving loop never interleave within a batch.
        self._send_lock = trio.Lock()

    async def serve(self) -> None:
        """Accept the connection and answer its events until the client closes it.

        The client closing the connection cancels this (quart-trio does), and with
        it the response in flight.
        """
        await self._websocket.accept()
        logger.info("WebSocket %s opened", self._websocket.path)
        try:
            with self._service.metrics.websocket_connection():
                await self._serve_events()
        finally:
            logger.info(
                "WebSocket %s closed after %d responses", self._websocket.path, self._responses
            )

    async def _serve_events(self) -> None:
        """Receive client events and start what they ask for, until cancelled."""
        async with trio.open_nursery() as nursery:
            while True:
                message = await self._websocket.receive()
                await self._dispatch(message, nursery)

    async def _dispatch(self, message: str | bytes | None, nursery: trio.Nursery) -> None:
        """Start the response a client event asks for, or answer it with an error."""
        try:
            event = await _decode(message)
            if self._current is not None:
                raise InvalidRequestError(
                    "A response is already in progress on this connection. Wait for its "
                    "terminal event (response.completed, response.incomplete or "
                    "response.failed) before sending the next response.create, or open "
                    "another connection to run responses in parallel.",
                    code="response_already_in_flight",
                )
            body, generate = _create_body(event)
        except ResponsesError as error:
            await self._send_error(error)
            return
        token = object()
        self._current = token
        nursery.start_soon(self._respond, body, generate, token)

    def _release(self, token: object) -> None:
        """Let the connection take the next ``response.create``, if ``token`` still
        holds it."""
        if self._current is token:
            self._current = None

    async def _respond(self, body: dict[str, Any], generate: bool, token: object) -> None:
        """Run one ``response.create``: its events, or an error event."""
        handle: ResponseHandle | None = None
        try:
            with faults_as_exceptions():  # a panic in native code: an error event too
                prepared = await self._service.prepare(body, owner=self._owner, local=self._cache)
                if not generate:
                    await self._warm_up(prepared, token)
                    return
                handle = await self._service.start(prepared, owner=self._owner)
                await self._forward(handle, prepared, token)
        except Exception as error:
            if handle is not None:
                handle.abandon()  # its events can no longer reach the client
            await self._send_error(_on_socket(error), release=token)
        except BaseException:
            if handle is not None:
                handle.abandon()  # the client went away: stop generating
            raise
        finally:
            self._release(token)

    async def _forward(
        self, handle: ResponseHandle, prepared: PreparedRequest, token: object
    ) -> None:
        """Send the response's events as they come, up to its terminal event.

        Raises:
            ServerError: this connection fell behind the response's event log.
            StoreError: the state backend holding the log failed.
        """
        with handle.subscribe() as subscription:
            while True:
                try:
                    frames = await subscription.receive_frames()
                except SubscriberLagged as lagged:
                    self._service.metrics.stream_lagged("websocket")
                    raise ServerError(
                        f"The events of response {handle.id!r} could not be sent: {lagged}. "
                        "The response was cancelled.",
                        code=errors.STREAM_LAGGED,
                    ) from None
                if not frames:
                    return
                await self._send_frames(frames, prepared, lambda: handle.response, token)

    async def _send_frames(
        self,
        frames: list[bytes],
        prepared: PreparedRequest,
        finished: Callable[[], dict[str, Any]],
        token: object,
    ) -> None:
        """Send frames, one message each. Before the terminal one goes out, the
        response is kept for ``previous_response_id`` and ``token`` releases the
        connection for the next ``response.create``: a client may send it as soon
        as it reads that event. ``finished`` gives the finished Response object.
        """
        messages = [_event_json(frame) for frame in frames]
        async with self._send_lock:
            if is_terminal_frame(frames[-1]):
                self._remember(prepared, finished())
                self._responses += 1
                self._release(token)
            for text in messages:
                await self._websocket.send(text)
        self._service.metrics.events_sent(len(messages), "websocket")

    async def _warm_up(self, prepared: PreparedRequest, token: object) -> None:
        """Answer ``generate: false``: a completed response with no output, kept here."""
        frames: list[bytes] = []
        now = int(time.time())
        builder = ResponseBuilder(
            response_id=new_id("resp"),
            model=self._service.config.model_name,
            created_at=now,
            echo=request_echo(prepared.request),
            background=False,
            emit=frames.append,
        )
        builder.start()
        builder.mark_in_progress()
        builder.finish("completed", now=now)
        await self._send_frames(frames, prepared, builder.snapshot, token)

    def _remember(self, prepared: PreparedRequest, response: dict[str, Any]) -> None:
        """Keep a finished response for ``previous_response_id`` on this connection.

        A response continuing a kept one is kept with the whole conversation
        before it (and the predecessor of its oldest turn, if that came from the
        store), so a chain never needs an older entry than the newest. Only
        completed and incomplete responses are kept: a failed or cancelled one
        cannot be continued (as with the store).
        """
        if response.get("status") not in ("completed", "incomplete"):
            return
        items = prepared.input_items
        previous_id = prepared.request.previous_response_id
        before = self._cache.get(previous_id) if previous_id is not None else None
        if before is not None:
            items = [*before.input_items, *before.response["output"], *items]
            response = {**response, "previous_response_id": before.previous_response_id}
        self._cache[response["id"]] = StoredResponse(response, items, self._owner)
        while len(self._cache) > CACHED_RESPONSES:
            self._cache.popitem(last=False)

    async def _send_error(self, error: Exception, *, release: object | None = None) -> None:
        """Send an ``error`` event for ``error`` (the connection stays open).

        ``release``, the token of the response that failed, releases the connection
        just before the event goes out, under the send lock: a successor's events
        always come after it.
        """
        detail, status = self._wire_error(error)
        logger.info(
            "WebSocket %s: error event %s %s",
            self._websocket.path,
            status,
            refusal(detail),
            extra={
                "status": status,
                "error_code": detail.code,
                "param": detail.param,
            },
        )
        text = encode_ascii_json(
            {"type": "error", "status": status, "error": detail.error_object()}
        )
        async with self._send_lock:
            if release is not None:
                self._release(release)
            await self._websocket.send(text)


async def _decode(message: str | bytes | None) -> dict[str, Any]:
    """A client event: a JSON object with a ``type``, in a text message.

    Raises:
        InvalidRequestError: a binary message (quart gives None for an empty one),
            not JSON, not an object, or no ``type``.
    """
    if not isinstance(message, str):
        raise InvalidRequestError(
            f"Got a binary WebSocket message ({len(message or b'')} bytes); send each event "
            'as a text message holding a JSON object, like {"type": "response.create", ...}.',
            code="unsupported_frame",
        )
    data = message.encode()
    event = await offload(len(data), partial(decode_json_body, data))
    if not isinstance(event, dict):
        raise InvalidRequestError(
            "Each WebSocket message must be a JSON object with a 'type', like "
            '{"type": "response.create", "model": "...", "input": "..."}.',
            code="invalid_type",
        )
    kind = event.get("type")
    if kind is None:
        raise InvalidRequestError(
            'Missing \'type\': send {"type": "response.create", ...} with the fields of a '
            "create request.",
            param="type",
            code="missing_required_parameter",
        )
    if kind != "response.create":
        shown = json.dumps(kind)  # in a message: the client's value as Python's json shows it
        raise InvalidRequestError(
            f"Unsupported event type {shown[:60]}: this server accepts 'response.create' "
            "events only.",
            param="type",
            code="invalid_value",
        )
    return event


def _create_body(event: dict[str, Any]) -> tuple[dict[str, Any], bool]:
    """The create body of a ``response.create`` event, and whether to generate.

    Raises:
        InvalidRequestError: ``background``, ``stream_id`` or a ``generate``
            that is not a boolean.
    """
    generate = event.get("generate", True)
    if not isinstance(generate, bool):
        raise InvalidRequestError(
            "Invalid 'generate': it must be true (the default: run the model) or false "
            "(prepare the response without output).",
            param="generate",
            code="invalid_type",
        )
    if event.get("background"):
        raise InvalidRequestError(
            "'background' is not supported in WebSocket mode: responses on a connection "
            "always stream to it. Create background responses with POST /v1/responses.",
            param="background",
            code="unsupported_parameter",
        )
    if event.get("stream_id") is not None:
        raise InvalidRequestError(
            "'stream_id' is not supported: this server runs one response at a time on a "
            "connection. Send response.create without it, or open another connection.",
            param="stream_id",
            code="unsupported_parameter",
        )
    # ``stream`` is implicit (some clients send true anyway): every response streams here.
    skipped = ("type", "generate", "background", "stream", "stream_id")
    body = {key: value for key, value in event.items() if key not in skipped}
    body["stream"] = True
    return body, generate


def _on_socket(error: Exception) -> Exception:
    """``error`` as WebSocket mode reports it: a predecessor that cannot be found is
    ``previous_response_not_found`` (400), whether it was never there, is not stored
    (``store: false``, and no longer kept by this connection) or was deleted."""
    if isinstance(error, NotFoundError) and error.param == "previous_response_id":
        return InvalidRequestError(
            f"{error.message} Responses created with store: false can be continued only "
            "on the connection that created them, from its most recent responses; start "
            "a new chain with the full input instead.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return error


def _event_json(frame: bytes) -> str:
    """The JSON of an SSE frame (`protocol.codec.encode_event`), as a text message."""
    return frame_data(frame).decode()
