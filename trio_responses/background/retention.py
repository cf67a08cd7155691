"""Keeps the event logs of finished background responses for replay, within limits.

A finished background job stays here until ``retention_s`` after it finished,
or until it is the oldest and keeping it would exceed ``max_streams`` logs or
``max_bytes`` bytes of frames in total. Whatever is dropped can no longer be
streamed again (``GET ?stream=true`` answers 400); the response itself is in
the store.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import final

import trio

from .job import Job


@final
class StreamRetention:
    """Finished background jobs by id, oldest first. Not thread-safe; never blocks."""

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
        self._jobs: OrderedDict[str, tuple[float, Job]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return (job for _, job in self._jobs.values())

    @property
    def retained_bytes(self) -> int:
        """Bytes of frames held by the retained logs."""
        return self._bytes

    def add(self, job: Job) -> None:
        """Keep ``job``'s log; may drop the oldest ones to stay within limits."""
        if self._retention_s <= 0:
            return
        self.discard(job.id)
        self._jobs[job.id] = (self._clock() + self._retention_s, job)
        self._bytes += job.log.retained_bytes
        while len(self._jobs) > self._max_streams or (
            self._bytes > self._max_bytes and len(self._jobs) > 1
        ):
            self._pop_oldest()

    def get(self, response_id: str) -> Job | None:
        entry = self._jobs.get(response_id)
        if entry is None:
            return None
        if entry[0] <= self._clock():
            self.discard(response_id)
            return None
        return entry[1]

    def discard(self, response_id: str) -> None:
        entry = self._jobs.pop(response_id, None)
        if entry is not None:
            self._bytes -= entry[1].log.retained_bytes

    def expire(self) -> int:
        """Drop every log past its retention; returns how many."""
        now = self._clock()
        expired = 0
        while self._jobs:
            expires_at, _ = next(iter(self._jobs.values()))
            if expires_at > now:
                break
            self._pop_oldest()
            expired += 1
        return expired

    def _pop_oldest(self) -> None:
        _, (_, job) = self._jobs.popitem(last=False)
        self._bytes -= job.log.retained_bytes
