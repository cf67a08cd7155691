"""Keeps the event logs of finished background responses for replay, within limits.

Only what a reader needs is kept: the ring of encoded frames and the key that
owns it (never the job, its prompt or its request). A finished log stays here
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
    """Finished background logs by response id, oldest first. Not thread-safe; never blocks."""

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
        self._logs: OrderedDict[str, tuple[float, EventLog, str | None]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._logs)

    @property
    def subscribers(self) -> int:
        """Open subscriptions on the retained logs."""
        return sum(log.subscribers for _, log, _ in self._logs.values())

    @property
    def retained_bytes(self) -> int:
        """Bytes of frames held by the retained logs."""
        return self._bytes

    def add(self, response_id: str, log: EventLog, owner: str | None) -> None:
        """Keep ``log``; may drop the oldest ones to stay within limits."""
        if self._retention_s <= 0:
            return
        self.discard(response_id)
        self._logs[response_id] = (self._clock() + self._retention_s, log, owner)
        self._bytes += log.retained_bytes
        while len(self._logs) > self._max_streams or (
            self._bytes > self._max_bytes and len(self._logs) > 1
        ):
            self._pop_oldest()

    def get(self, response_id: str, owner: str | None) -> EventLog | None:
        """The retained log of ``response_id`` if ``owner`` owns it."""
        entry = self._logs.get(response_id)
        if entry is None:
            return None
        expires_at, log, log_owner = entry
        if expires_at <= self._clock():
            self.discard(response_id)
            return None
        return log if log_owner == owner else None

    def discard(self, response_id: str) -> None:
        entry = self._logs.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry[1].retained_bytes

    def expire(self) -> int:
        """Drop every log past its retention; returns how many."""
        now = self._clock()
        expired = 0
        while self._logs:
            expires_at, _, _ = next(iter(self._logs.values()))
            if expires_at > now:
                break
            self._pop_oldest()
            expired += 1
        return expired

    def _pop_oldest(self) -> None:
        _, (_, log, _) = self._logs.popitem(last=False)
        self._bytes -= log.retained_bytes
