"""Writing a stream's events from the producer's task: `DirectWrites`.

An SSE stream following a log in this process (`SSEBody`, on an HTTP/1.1
connection of our server) may have its events written by whoever appends them
— the job's task, the scripted engine's clock, vLLM's output reader — when
the reader's socket takes them at once: no wake-up of the reader's task per
event, which at many streams is most of a token's cost (docs/benchmarks.md).

This module is all of that arrangement that touches the reader's connection:
framing the frames as one chunk, a write that never waits (`write_nowait`),
the rest of a partial write owed to the reader's own task (`pending`), and
counting what it wrote. What it guarantees the producer: `DirectWrites.take`
never blocks, never checkpoints and never raises; a connection that fails
while it writes is the reader's problem, found by the reader's task at its next
write (the writer stops taking: the reader's task writes from then on).

One switch turns it off: ``--reader-writes`` (`Config.reader_writes`); then
every stream's own task writes its socket.
"""

from __future__ import annotations

import logging
from typing import final

from ..metrics import Metrics
from .asgi import ChunkedBody

logger = logging.getLogger("trio_responses.api")

COUNT_BATCH = 64
"""Events `DirectWrites.take` wrote are counted in the metrics this many at a time
(the rest by `count_sent`): a counter's lock costs about as much as the write."""


@final
class DirectWrites:
    """One stream's writes from the producer's task (see the module)."""

    __slots__ = ("_body", "_failed", "_metrics", "_uncounted", "pending")

    def __init__(self, body: ChunkedBody, metrics: Metrics | None = None) -> None:
        self._body = body
        self._metrics = metrics
        self._uncounted = 0
        self._failed = False
        self.pending = b""
        """The rest of a chunk `take` could only partly write: the reader's task
        writes it (`write_pending`) before anything else."""

    def take(self, frames: list[bytes]) -> tuple[int, bool]:
        """Write ``frames`` (not empty) as one chunk, if the socket takes it now.

        Returns (frames taken, all on the wire): (all, True) when written whole;
        (all, False) when only part is (the rest is `pending`); (0, False) when
        the socket takes nothing now, another write is under way, a partial
        write is still owed, or writing failed. Never raises.
        """
        if self.pending or self._failed:
            return 0, False
        try:
            framed = self._body.frame(b"".join(frames))
            written = self._body.write_nowait(framed)
        except Exception:  # the reader's connection: never the producer's failure
            self._failed = True
            logger.exception("writing a stream's events from its producer failed")
            return 0, False
        if not written:
            return 0, False
        self._uncounted += len(frames)
        if self._uncounted >= COUNT_BATCH:
            self.count_sent()
        if written < len(framed):
            self.pending = framed[written:]
            return len(frames), False
        return len(frames), True

    async def write_pending(self) -> bool:
        """Write the rest of a partial `take` (the reader's task); whether there was one."""
        if not self.pending:
            return False
        pending, self.pending = self.pending, b""
        await self._body.write_framed(pending)
        return True

    def count_sent(self) -> None:
        """Count in the metrics the events written and not counted yet."""
        uncounted, self._uncounted = self._uncounted, 0
        if uncounted and self._metrics is not None:
            self._metrics.events_sent(uncounted)
