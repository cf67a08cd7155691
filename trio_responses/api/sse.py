"""The SSE response body: a subscription's frames, coalesced into few writes.

Each wake-up writes everything the subscription has queued in one chunk
(STACK.md: one ASGI send costs ~100 µs, so writing event by event caps a
stream near 10k events/s). A quiet live stream gets a ``: keep-alive``
comment every ``keepalive_s``; the stream ends with ``data: [DONE]``.

Served through `shield_final_send`, the body writes its chunks itself (see
`SSEBody._write_all`); iterated directly, it yields them one by one.

This is a class, not an async generator, on purpose: Quart closes the body
with ``aclose()`` from whatever task notices the disconnect, and a class has
no suspended frame (and no context) for that to tear down.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import final

import trio
from hypercorn.typing import ASGISendCallable

from .._exceptions import StoreError
from .._raw_connection import RawWrite
from ..background.event_log import SubscriberLagged
from ..background.subscription import LogSubscription, Subscription
from ..metrics import Metrics
from ..protocol import errors
from ..protocol.builder import stream_error_frame
from ..protocol.codec import DONE, KEEPALIVE, is_terminal_frame
from .asgi import response_chunked_body, response_send
from .direct_writes import DirectWrites

_CHUNKS_PER_CHECKPOINT = 16
"""A body writing chunk after chunk without waiting yields this often."""

_DIRECT_GAP_S = 0.001
"""`SSEBody._take` writes an event only this long after the previous write.

Events that come closer together (a fast producer, the several events that end
a response) wake the body's task instead, which then writes all that came
meanwhile in one chunk: one write per event would cost more than the wake-up.
"""

_TIMED_WAKE_UPS = 4
"""A body the producer writes keeps itself alive by deadlines on its waits until it
has been woken this many times with events to write; then a task does (see
`SSEBody._write_all`): a wait under a deadline costs a cancel scope each time."""


@final
class SSEBody:
    """Async iterator of byte chunks for a streaming HTTP response."""

    __slots__ = (
        "_direct",
        "_finished",
        "_keepalive_s",
        "_last_write",
        "_metrics",
        "_on_close",
        "_producer_writes",
        "_subscription",
        "_write_last",
        "_writing",
    )

    def __init__(
        self,
        subscription: Subscription,
        *,
        keepalive_s: float,
        on_close: Callable[[], None] | None = None,
        metrics: Metrics | None = None,
        producer_writes: bool = False,
    ) -> None:
        """``metrics`` counts the events sent (once per write) and lagged readers;
        ``producer_writes``: whether the log's producer may write this stream's
        events (`DirectWrites`), where the connection allows."""
        self._subscription = subscription
        self._keepalive_s = keepalive_s
        self._on_close = on_close
        self._metrics = metrics
        self._finished = False
        self._last_write = 0.0
        self._producer_writes = producer_writes
        self._direct: DirectWrites | None = None
        """Set while frames may be written straight from the producer (`_take`)."""
        self._writing = False
        """A keep-alive is being written (`_take` must not write meanwhile)."""
        self._write_last: RawWrite | None = None
        """Writes the stream's last words, if not the usual way (`ChunkedBody.write_last`)."""

    def __aiter__(self) -> SSEBody:
        return self

    async def __anext__(self) -> bytes:
        if self._finished:
            raise StopAsyncIteration
        send = response_send.get()
        if send is not None:
            await self.write_all(send)
            raise StopAsyncIteration
        with trio.move_on_after(self._keepalive_s):
            return await self._next_chunk()
        return KEEPALIVE

    async def write_all(self, send: ASGISendCallable) -> None:
        """Write the whole stream as the body of the response ``send`` has started.

        On an HTTP/1.1 connection of our server (`response_chunked_body`), straight
        to the socket; else as ASGI body messages. The caller ends the body.
        """
        body = response_chunked_body.get()
        if body is None:
            await self._write_all(_body_writer(send))
        else:
            if self._producer_writes and isinstance(self._subscription, LogSubscription):
                self._direct = DirectWrites(body, self._metrics)
            self._write_last = body.write_last
            await self._write_all(body.write)

    async def _write_all(self, write: RawWrite) -> None:
        """Write the whole stream with ``write``, keep-alives included.

        Served by our ASGI wrapper, the body writes its chunks itself: no round
        trip through Quart's body loop; on HTTP/1.1, not through hypercorn's
        stream and h11 either (`response_chunked_body`). Following a log in this
        process, an HTTP/1.1 body may even be written by the producer (`_take`):
        events the socket takes at once cost no wake-up of this task, whose waits
        then carry the keep-alive's deadline. A body woken `_TIMED_WAKE_UPS` times
        with events to write (other readers, a fast producer) hands its
        keep-alives to a second task instead, as any other body does: no cancel
        scope per wake-up.
        """
        self._last_write = trio.current_time()
        if self._direct is not None and await self._write_chunks(
            write, timed_wake_ups=_TIMED_WAKE_UPS
        ):
            return
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._keep_alive, write)
            await self._write_chunks(write)
            nursery.cancel_scope.cancel()

    async def _write_chunks(self, write: RawWrite, *, timed_wake_ups: int = 0) -> bool:
        """Write chunks until the stream ends; returns whether it did.

        With ``timed_wake_ups``, each wait carries the keep-alive's deadline
        (`_keep_alive_due`), until this task has been woken that many times with
        events to write: then it returns False, the stream still going.
        """
        turns = 0
        while not self._finished:
            if timed_wake_ups:
                with trio.move_on_at(self._last_write + self._keepalive_s) as waiting:
                    chunk = await self._next_chunk()
                if waiting.cancelled_caught:
                    await self._keep_alive_due(write)
                    continue
            else:
                chunk = await self._next_chunk()
            # The rest of a chunk `_take` began goes first (it woke us for it).
            await self._write_pending()
            if not chunk:
                continue
            if self._finished:  # the last words: every event before them is counted
                self._count_sent()
                await (self._write_last or write)(chunk)
            else:
                await write(chunk)
            self._last_write = trio.current_time()
            if timed_wake_ups:
                timed_wake_ups -= 1
                if not timed_wake_ups and not self._finished:
                    return False
            turns += 1
            if turns % _CHUNKS_PER_CHECKPOINT == 0:
                # Neither a subscription with frames ready nor a write the
                # socket takes at once yields: let the other tasks run.
                await trio.lowlevel.checkpoint()
        return True

    async def _keep_alive_due(self, write: RawWrite) -> None:
        """A wait for frames reached the keep-alive's deadline: write one if nothing
        was written since (the producer may have), else what `_take` left owing."""
        if not await self._write_pending():
            if self._finished or trio.current_time() < self._last_write + self._keepalive_s:
                return
            await self._write_keep_alive(write)
        self._last_write = trio.current_time()

    async def _write_pending(self) -> bool:
        """Write the rest of a chunk `_take` could only partly write; whether there was one."""
        direct = self._direct
        return direct is not None and await direct.write_pending()

    async def _keep_alive(self, write: RawWrite) -> None:
        """Write a keep-alive comment whenever nothing was written for ``keepalive_s``.

        A chunk `_take` left half-written is being written by the body's task:
        that counts as writing (a keep-alive could not go before it anyway).
        """
        keepalive_s = self._keepalive_s
        while True:
            now = trio.current_time()
            if self._direct is not None and self._direct.pending:
                self._last_write = now
            due = self._last_write + keepalive_s
            if now < due:
                await trio.sleep_until(due)
                continue
            if self._finished:
                return
            await self._write_keep_alive(write)
            self._last_write = trio.current_time()

    async def _write_keep_alive(self, write: RawWrite) -> None:
        """One keep-alive comment; the producer writes nothing meanwhile (`_take`)."""
        self._writing = True
        try:
            await write(KEEPALIVE)
        finally:
            self._writing = False

    def _take(self, frames: list[bytes]) -> tuple[int, bool]:
        """Offer ``frames`` to the producer's writer (`DirectWrites.take`), from the
        producer's task: see it for what it returns.

        Not while a keep-alive is being written, once the stream is finished, when
        the frames end with the terminal event (the body's task writes it with the
        stream's last words: one write), or within `_DIRECT_GAP_S` of the previous
        write (the body's task batches those).
        """
        direct = self._direct
        if (
            direct is None
            or self._writing
            or self._finished
            or not frames
            or is_terminal_frame(frames[-1])
        ):
            return 0, False
        now = trio.current_time()
        if now - self._last_write < _DIRECT_GAP_S:
            return 0, False
        taken = direct.take(frames)
        if taken[0]:
            self._last_write = now
        return taken

    async def _next_chunk(self) -> bytes:
        """The next chunk to write: the frames queued, or the stream's last words.

        Empty (following directly only) when woken to finish a write `_take` began.
        """
        subscription = self._subscription
        try:
            if self._direct is not None and isinstance(subscription, LogSubscription):
                frames = await subscription.receive_frames_or_give(self._take)
                if not frames and not subscription.closed:
                    return b""
            else:
                frames = await subscription.receive_frames()
        except SubscriberLagged as lagged:
            self._finished = True
            if self._metrics is not None:
                self._metrics.stream_lagged()
            message = (
                f"This stream was closed because {lagged}. Resume with "
                f"starting_after={lagged.wanted - 1} while the events are retained."
            )
            error = errors.server_error(message, errors.STREAM_LAGGED)
            return stream_error_frame(lagged.wanted, error) + DONE
        except StoreError as failure:
            # The backend holding this log failed mid-stream: end it with a reason.
            self._finished = True
            cursor = self._subscription.cursor
            message = (
                f"This stream was interrupted: {failure.message} Resume with "
                f"starting_after={cursor}."
            )
            error = errors.server_error(message, errors.STORE_UNAVAILABLE)
            return stream_error_frame(cursor + 1, error) + DONE
        if not frames:
            self._finished = True
            return DONE
        if self._metrics is not None:
            self._metrics.events_sent(len(frames))
        if is_terminal_frame(frames[-1]):  # nothing follows it: end with it, in one write
            self._finished = True
            frames.append(DONE)
        return b"".join(frames)

    def _count_sent(self) -> None:
        if self._direct is not None:
            self._direct.count_sent()

    async def aclose(self) -> None:
        """Called by Quart when the response ends, normally or not.

        Never checkpoints, so it completes even inside a cancelled scope.
        """
        self._finished = True
        self._count_sent()
        self._subscription.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()


def _body_writer(send: ASGISendCallable) -> RawWrite:
    """A chunk of the body as an ASGI message (not HTTP/1.1, or another server)."""

    async def write(chunk: bytes) -> None:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})

    return write
