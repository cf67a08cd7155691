"""Readers of one event log: replay from a cursor, then live, until the terminal event.

`Subscription` is what the HTTP layer and embedding code read. Two kinds:

- `LogSubscription` follows an in-process `EventLog` ring (a job running here,
  or a finished log the memory backend retains);
- `ReaderSubscription` follows a log held by a backend (SQLite, Redis) through
  a `LogReader`: a finished log, or one a job on another replica writes.

Both are context managers (``with await service.subscribe(...) as s:``), both
iterate decoded events with ``async for``, and `receive_frames` gives the
encoded SSE frames in batches (what the HTTP layer writes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, final

from ..protocol.codec import decode_event, is_terminal_frame
from .event_log import EventLog, SubscriberLagged


class Subscription(Protocol):
    @property
    def cursor(self) -> int:
        """Sequence number of the last frame handed out."""
        ...

    async def receive_frames(self) -> list[bytes]:
        """The frames available after the cursor, waiting for one if needed.

        Returns an empty list once the log is complete and fully read (and then
        closes the subscription).

        Raises:
            SubscriberLagged: the reader fell behind the log's ring.
            StoreError: the backend holding the log failed.

        Cancellation: safe; frames are consumed only when returned.
        """
        ...

    def close(self) -> None:
        """Stop reading and release what the subscription holds. Idempotent; never blocks."""
        ...

    def __enter__(self) -> Subscription: ...

    def __exit__(self, *exc_info: object) -> None: ...

    def __aiter__(self) -> Subscription: ...

    async def __anext__(self) -> dict[str, Any]: ...


class _Decoding:
    """``async for`` over decoded events, on top of ``receive_frames``."""

    __slots__ = ("_pending",)

    _pending: list[bytes]

    async def receive_frames(self) -> list[bytes]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __aiter__(self) -> Any:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if not self._pending:
            frames = await self.receive_frames()
            if not frames:
                raise StopAsyncIteration
            self._pending = frames[::-1]
        return decode_event(self._pending.pop())


@final
class LogSubscription(_Decoding):
    """Follows an in-process `EventLog` from ``starting_after`` (exclusive).

    Not constructed directly: use `ResponsesService.subscribe`.
    """

    __slots__ = (
        "_cursor",
        "_log",
        "_max_batch_bytes",
        "_open",
    )

    def __init__(self, log: EventLog, starting_after: int, *, max_batch_bytes: int = 1 << 18):
        self._log = log
        self._cursor = starting_after
        self._max_batch_bytes = max_batch_bytes
        self._pending = []  # decoded lazily by __anext__, newest first
        self._open = True
        log.subscribers += 1

    def close(self) -> None:
        if self._open:
            self._open = False
            self._log.subscribers -= 1

    @property
    def cursor(self) -> int:
        return self._cursor

    @property
    def closed(self) -> bool:
        """Closed: read to the end (or closed by its owner)."""
        return not self._open

    async def receive_frames(self) -> list[bytes]:
        return await self._receive(None)

    async def receive_frames_or_give(
        self, take: Callable[[list[bytes]], tuple[int, bool]]
    ) -> list[bytes]:
        """`receive_frames`, but while this reader waits, frames appended may be
        offered to ``take`` in the appending task (see `EventLog.wait_after`).

        ``take(frames)`` returns how many of ``frames`` it took (from the front;
        the cursor moves past them) and whether to keep waiting (it delivered
        them all) or to wake (e.g. to finish a write). It must not raise.
        Returns the frames not given away, or ``[]`` when woken with none left
        (`closed` tells the end apart from a wake-up ``take`` asked for).
        """
        return await self._receive(take)

    async def _receive(self, take: Callable[[list[bytes]], tuple[int, bool]] | None) -> list[bytes]:
        log = self._log
        frames = log.read_after(self._cursor, self._max_batch_bytes)
        if not frames:
            if log.closed:
                self.close()
                return []
            await log.wait_after(self._cursor, None if take is None else self._giver(take))
            frames = log.read_after(self._cursor, self._max_batch_bytes)
            if not frames and log.closed:
                self.close()
        self._cursor += len(frames)
        return frames

    def _giver(self, take: Callable[[list[bytes]], tuple[int, bool]]) -> Callable[[], bool]:
        """The log's direct taker: offers what follows the cursor to ``take``."""
        log = self._log

        def give() -> bool:
            try:
                offered = log.read_after(self._cursor, self._max_batch_bytes)
            except SubscriberLagged:
                return False  # the reader finds out when it wakes
            taken, keep_waiting = take(offered)
            self._cursor += taken
            return keep_waiting and taken == len(offered)

        return give


class LogReader(Protocol):
    """A backend's view of one stored log, for `ReaderSubscription`."""

    async def read_after(self, cursor: int) -> list[bytes]:
        """Frames with sequence numbers > ``cursor``, in order (a bounded batch).

        While the log is still being written and nothing follows ``cursor``,
        waits for more (it may return ``[]`` after a while with nothing new:
        the caller asks again). Returns ``[]`` at once when the log is
        complete and ``cursor`` is at or past its terminal event.

        Raises:
            SubscriberLagged: frame ``cursor + 1`` is no longer retained.
            StoreError: the backend failed.

        Cancellation: safe; nothing is consumed unless returned.
        """
        ...

    def complete_through(self) -> int | None:
        """Sequence number of the terminal event, once known to this reader."""
        ...

    def close(self) -> None:
        """Release the reader's resources. Never blocks."""
        ...


@final
class ReaderSubscription(_Decoding):
    """Follows a backend's stored log through a `LogReader`.

    Not constructed directly: backends return it from `EventLogStore.open`.
    """

    def __init__(self, reader: LogReader, starting_after: int) -> None:
        self._reader = reader
        self._cursor = starting_after
        self._pending = []
        self._done = False
        self._open = True

    @property
    def cursor(self) -> int:
        return self._cursor

    def close(self) -> None:
        if self._open:
            self._open = False
            self._reader.close()

    async def receive_frames(self) -> list[bytes]:
        while not self._done:
            last = self._reader.complete_through()
            if last is not None and self._cursor >= last:
                break
            frames = await self._reader.read_after(self._cursor)
            if frames:
                self._cursor += len(frames)
                if is_terminal_frame(frames[-1]):
                    self._done = True
                return frames
        self.close()
        return []
