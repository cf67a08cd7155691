"""``memory://``: a bounded in-process store (LRU over finished responses, with TTL).

Running responses (status ``queued``/``in_progress``) are never evicted; they
do not count towards ``max_responses``. Finished ones are evicted least recently
used first, and dropped ``ttl_s`` after they were stored.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import final

import trio

from .base import StoredResponse

_RUNNING = ("queued", "in_progress")


@final
class MemoryStore:
    """Implements `ResponseStore` in memory. Operations never block."""

    def __init__(
        self,
        *,
        max_responses: int,
        ttl_s: float = math.inf,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        if max_responses < 1:
            raise ValueError("max_responses must be >= 1")
        self._max = max_responses
        self._ttl = ttl_s
        self._clock = clock
        self._finished: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()
        self._running: dict[str, StoredResponse] = {}

    def __len__(self) -> int:
        return len(self._finished) + len(self._running)

    async def put(self, record: StoredResponse) -> None:
        await trio.lowlevel.checkpoint()
        key = record.id
        self._running.pop(key, None)
        self._finished.pop(key, None)
        if record.status in _RUNNING:
            self._running[key] = record
            return
        self._finished[key] = (self._clock() + self._ttl, record)
        while len(self._finished) > self._max:
            self._finished.popitem(last=False)

    async def get(self, response_id: str) -> StoredResponse | None:
        await trio.lowlevel.checkpoint()
        running = self._running.get(response_id)
        if running is not None:
            return running
        entry = self._finished.get(response_id)
        if entry is None:
            return None
        expires_at, record = entry
        if expires_at <= self._clock():
            del self._finished[response_id]
            return None
        self._finished.move_to_end(response_id)
        return record

    async def delete(self, response_id: str) -> bool:
        await trio.lowlevel.checkpoint()
        found = self._running.pop(response_id, None) is not None
        return self._finished.pop(response_id, None) is not None or found

    def expire(self) -> int:
        """Drop every expired record now; returns how many."""
        now = self._clock()
        expired = [key for key, (expires_at, _) in self._finished.items() if expires_at <= now]
        for key in expired:
            del self._finished[key]
        return len(expired)

    async def aclose(self) -> None:
        await trio.lowlevel.checkpoint()
