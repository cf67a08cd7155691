"""Keeps the event logs of finished background responses for replay, within limits.

Only what a reader needs is kept: the ring of encoded frames, under its key
(owner, response id), never the job, its prompt or its request. A finished log stays here
until ``retention_s`` after it finished, or until it is the oldest and keeping
it would exceed ``max_streams`` logs or ``max_bytes`` bytes of frames in total.
Whatever is dropped can no longer be streamed again (``GET ?stream=true``
answers 400); the response itself is in the store.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import final

import trio

from .event_log import EventLog


@final
class StreamRetention:
    """Finished background logs by (owner, response id), oldest first. Not thread-safe;
    never blocks."""

    def __init__(
        self,
        *,
        max_streams: int,
        max_bytes: int,
        retention_s: float,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self._max_streams = max_streams
        self._max_bytes = max_bytes
        self._retention_s = retention_s
        self._clock = clock
        self._logs: OrderedDict[tuple[str | None, str], tuple[float, EventLog]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._logs)

    @property
    def subscribers(self) -> int:
        """Open subscriptions on the retained logs."""
        return sum(log.subscribers for _, log in self._logs.values())

    @property
    def retained_bytes(self) -> int:
        """Bytes of frames held by the retained logs."""
        return self._bytes

    def add(self, response_id: str, log: EventLog, owner: str | None) -> None:
        """Keep ``log`` of ``owner``'s response; may drop the oldest ones to stay within
        limits."""
        if self._retention_s <= 0:
            return
        self.discard(response_id, owner)
        self._logs[owner, response_id] = (self._clock() + self._retention_s, log)
        self._bytes += log.retained_bytes
        while len(self._logs) > self._max_streams or (
            self._bytes > self._max_bytes and len(self._logs) > 1
        ):
            self._pop_oldest()

    def get(self, response_id: str, owner: str | None) -> EventLog | None:
        """The retained log of ``owner``'s response ``response_id``."""
        entry = self._logs.get((owner, response_id))
        if entry is None:
            return None
        expires_at, log = entry
        if expires_at <= self._clock():
            self.discard(response_id, owner)
            return None
        return log

    def discard(self, response_id: str, owner: str | None) -> None:
        entry = self._logs.pop((owner, response_id), None)
        if entry is not None:
            self._bytes -= entry[1].retained_bytes

    def expire(self) -> int:
        """Drop every log past its retention; returns how many."""
        now = self._clock()
        expired = 0
        while self._logs:
            expires_at, _ = next(iter(self._logs.values()))
            if expires_at > now:
                break
            self._pop_oldest()
            expired += 1
        return expired

    def _pop_oldest(self) -> None:
        _, (_, log) = self._logs.popitem(last=False)
        self._bytes -= log.retained_bytes
