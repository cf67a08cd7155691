"""A reader of one event log: replay from a cursor, then live, until the end."""

from __future__ import annotations

from typing import Any, final

from ..protocol.sse import decode_event
from .event_log import EventLog


@final
class Subscription:
    """Follows an `EventLog` from ``starting_after`` (exclusive).

    Not constructed directly: use `ResponsesService.subscribe`. Iterating with
    ``async for`` gives decoded event dicts; `receive_frames` gives the encoded
    SSE frames in batches (what the HTTP layer writes).
    """

    def __init__(self, log: EventLog, starting_after: int, *, max_batch_bytes: int = 1 << 18):
        self._log = log
        self._cursor = starting_after
        self._max_batch_bytes = max_batch_bytes
        self._pending: list[bytes] = []  # decoded lazily by __anext__, newest first
        self._open = True
        log.subscribers += 1

    def close(self) -> None:
        """Stop reading. Idempotent."""
        if self._open:
            self._open = False
            self._log.subscribers -= 1

    @property
    def cursor(self) -> int:
        """Sequence number of the last frame handed out."""
        return self._cursor

    async def receive_frames(self) -> list[bytes]:
        """The frames available after the cursor (up to ``max_batch_bytes``),
        waiting for one if needed.

        Returns an empty list once the log is closed and fully read (and then
        closes the subscription).

        Raises:
            SubscriberLagged: the reader fell behind the log's ring.

        Cancellation: safe; frames are consumed only when returned.
        """
        log = self._log
        frames = log.read_after(self._cursor, self._max_batch_bytes)
        if not frames:
            if log.closed:
                self.close()
                return []
            await log.wait_after(self._cursor)
            frames = log.read_after(self._cursor, self._max_batch_bytes)
        self._cursor += len(frames)
        return frames

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __aiter__(self) -> Subscription:
        return self

    async def __anext__(self) -> dict[str, Any]:
        if not self._pending:
            frames = await self.receive_frames()
            if not frames:
                raise StopAsyncIteration
            self._pending = frames[::-1]
        return decode_event(self._pending.pop())
