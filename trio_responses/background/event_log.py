"""A response's event log: a bounded ring of encoded SSE frames, read by cursors.

One producer appends frames (each encoded once); any number of subscribers
read from their own cursor, replaying what the ring still holds and then
following live. The producer never waits: appending is synchronous and a
subscriber that falls behind the ring's tail is told so (`SubscriberLagged`)
instead of slowing anyone down. Memory is the ring (at most ``max_events``
frames and ``max_bytes`` bytes, the newest frame always kept), whatever the
number of subscribers.

Wake-ups are batched: a waiting subscriber is woken once per batch of appends
(whatever the producer appended before its next checkpoint) and takes every
frame available in one read.
"""

from __future__ import annotations

from bisect import bisect_left
from typing import final

import trio


class SubscriberLagged(Exception):
    """The subscriber's next event was dropped from the ring before it read it."""

    def __init__(self, wanted: int, oldest: int) -> None:
        super().__init__(
            f"the client fell behind: event {wanted} is no longer retained "
            f"(oldest retained is {oldest})"
        )
        self.wanted = wanted
        self.oldest = oldest


@final
class EventLog:
    """Bounded, append-only log of SSE frames numbered 0, 1, 2…"""

    def __init__(self, *, max_events: int, max_bytes: int) -> None:
        if max_events < 1 or max_bytes < 1:
            raise ValueError("max_events and max_bytes must be >= 1")
        self._max_events = max_events
        self._max_bytes = max_bytes
        self._frames: list[bytes] = []
        self._ends: list[int] = []  # _ends[i]: bytes appended up to and including _frames[i]
        self._appended_bytes = 0
        self._head = 0  # index in _frames of the oldest retained frame
        self._first = 0  # sequence number of _frames[_head]
        self._bytes = 0
        self._closed = False
        self._changed = trio.Event()
        self._waiting = False
        self.finished_at: float | None = None
        self.subscribers = 0
        """Open `Subscription` objects reading this log."""

    # -- producer ------------------------------------------------------------------

    def append(self, frame: bytes) -> None:
        """Add the next frame. Never blocks; may drop the oldest frames."""
        if self._closed:
            raise RuntimeError("append() after close()")
        self._frames.append(frame)
        self._appended_bytes += len(frame)
        self._ends.append(self._appended_bytes)
        self._bytes += len(frame)
        self._trim()
        self._wake()

    def close(self) -> None:
        """No more frames: readers finish once they have read everything."""
        if not self._closed:
            self._closed = True
            self.finished_at = trio.current_time()
            self._wake()

    # -- state ------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def next_sequence_number(self) -> int:
        """The number the next appended frame gets (= frames appended so far)."""
        return self._first + len(self._frames) - self._head

    @property
    def oldest_sequence_number(self) -> int:
        """Number of the oldest frame still retained."""
        return self._first

    @property
    def retained_events(self) -> int:
        return len(self._frames) - self._head

    @property
    def retained_bytes(self) -> int:
        return self._bytes

    # -- readers -------------------------------------------------------------------------

    def read_after(self, cursor: int, max_bytes: int | None = None) -> list[bytes]:
        """Frames with sequence number > ``cursor`` (maybe none).

        With ``max_bytes``, stops once that many bytes are taken (but always
        takes at least one frame when there is one).

        Raises:
            SubscriberLagged: frame ``cursor + 1`` was already dropped.
        """
        wanted = cursor + 1
        if wanted < self._first:
            raise SubscriberLagged(wanted, self._first)
        frames = self._frames
        start = self._head + (wanted - self._first)
        if max_bytes is None or start >= len(frames):
            return frames[start:]
        ends = self._ends
        # The first frame whose end reaches the budget is the last one taken.
        budget = ends[start] - len(frames[start]) + max_bytes
        end = bisect_left(ends, budget, start) + 1
        return frames[start:end]

    async def wait_after(self, cursor: int) -> None:
        """Wait until there is a frame after ``cursor`` or the log is closed.

        Cancellation: safe; nothing is consumed by waiting.
        """
        while not self._closed and self.next_sequence_number <= cursor + 1:
            self._waiting = True
            await self._changed.wait()

    # -- internals -------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._waiting:
            self._waiting = False
            self._changed.set()
            self._changed = trio.Event()

    def _trim(self) -> None:
        frames = self._frames
        while len(frames) - self._head > 1 and (
            len(frames) - self._head > self._max_events or self._bytes > self._max_bytes
        ):
            self._bytes -= len(frames[self._head])
            frames[self._head] = b""
            self._head += 1
            self._first += 1
        # Compact once the dropped prefix dominates: amortised O(1) per frame.
        if self._head > 1024 and self._head * 2 > len(frames):
            del frames[: self._head]
            del self._ends[: self._head]
            self._head = 0
