"""Event logs in SQLite: one row per appended batch of frames, read back by offset."""

from __future__ import annotations

import logging
import math
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import final

import trio

from ...background.event_log import EventLog, SubscriberLagged
from ...background.subscription import ReaderSubscription, Subscription
from ...protocol.builder import terminal_frame
from ...protocol.codec import decode_json, is_terminal_frame, split_frames
from ..base import (
    LogStatistics,
    StoredResponse,
    StoreError,
)
from ._file import Database

logger = logging.getLogger("trio_responses.store.sqlite")

_READ_BATCH_BYTES = 1 << 18
"""Most bytes one `read_after` returns (at least one frame): one SSE write's worth."""
_ROW_BYTES = 1 << 16
"""Frames per stored row, in bytes (one append may write several rows)."""
_INCOMPLETE_POLL_S = 0.05
"""Wait of a reader of an incomplete log with nothing new. Only a dead process's log
(until recovery terminates it) is read so: this process's own jobs are followed in
their in-process rings."""


def _split(batch: bytes) -> list[bytes]:
    """The frames of one stored batch (concatenated SSE frames)."""
    try:
        return split_frames(batch)
    except ValueError as error:
        raise StoreError(f"SQLite store: a damaged event log batch ({error})") from error


@final
class SqliteEventLogs:
    """Implements `EventLogStore` in the ``logs`` and ``log_batches`` tables."""

    live = True
    # Durability, not freshness: nobody else reads a running log, so a crash loses
    # at most this much of it, and most responses are written once, at the end.
    write_interval_s = 0.2

    def __init__(
        self,
        db: Database,
        *,
        replay_events: int,
        replay_bytes: int,
        retention_s: float,
        max_streams: int,
        max_bytes: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db = db
        self._replay_events = replay_events
        self._replay_bytes = replay_bytes
        self._retention_s = retention_s
        self._max_streams = max_streams
        self._max_bytes = max_bytes
        self._clock = clock
        # Complete logs and their bytes, for statistics() without I/O and for the
        # retention bounds. Written in the worker thread only (re-read after a rollback).
        self._complete = 0
        self._complete_bytes = 0
        db.reloads.append(self.load)

    def load(self) -> None:
        """Read the counters (worker thread, at open)."""
        row = self._db.connection.execute(
            "SELECT count(*), coalesce(sum(bytes), 0) FROM logs WHERE complete"
        ).fetchone()
        self._complete, self._complete_bytes = int(row[0]), int(row[1])

    def statistics(self) -> LogStatistics:
        return LogStatistics(self._complete, self._complete_bytes)

    # -- writing -----------------------------------------------------------------------

    async def append(
        self, response_id: str, frames: Sequence[bytes], *, first: int, owner: str | None
    ) -> None:
        if not frames:
            await trio.lowlevel.checkpoint()
            return
        frames = list(frames)  # the caller's list may change while the thread runs

        def work() -> None:
            with self._db.transaction() as db:
                self._append(db, response_id, frames, first, owner)

        await self._db.run(work)

    def _append(
        self,
        db: sqlite3.Connection,
        response_id: str,
        frames: list[bytes],
        first: int,
        owner: str | None,
    ) -> None:
        meta = db.execute(
            "SELECT next_seq, oldest_seq, bytes, complete FROM logs WHERE id = ?", (response_id,)
        ).fetchone()
        if meta is None:
            db.execute(
                "INSERT INTO logs (id, owner, next_seq, oldest_seq, bytes) VALUES (?, ?, ?, ?, 0)",
                (response_id, owner, first, first),
            )
            next_seq, oldest, size = first, first, 0
        else:
            next_seq, oldest, size, complete = meta
            if complete:
                return  # nothing follows the terminal event
        if first < next_seq:
            # A retried append whose first attempt was committed: keep what is new.
            frames = frames[next_seq - first :]
            first = next_seq
            if not frames:
                return
        elif first > next_seq:
            # Frames were lost (appends that failed for good): the log restarts here,
            # and readers of the missing part are told they lagged.
            db.execute("DELETE FROM log_batches WHERE id = ?", (response_id,))
            oldest, size = first, 0
        # Rows of about _ROW_BYTES at most, so a reader resuming anywhere reads little.
        begin = 0
        while begin < len(frames):
            end, row_bytes = begin, 0
            while end < len(frames) and (end == begin or row_bytes < _ROW_BYTES):
                row_bytes += len(frames[end])
                end += 1
            batch = b"".join(frames[begin:end])
            db.execute(
                "INSERT INTO log_batches (id, first_seq, last_seq, bytes, frames)"
                " VALUES (?, ?, ?, ?, ?)",
                (response_id, first + begin, first + end - 1, len(batch), batch),
            )
            size += len(batch)
            begin = end
        last = first + len(frames) - 1
        if last + 1 - oldest > self._replay_events or size > self._replay_bytes:
            oldest, size = self._trim(db, response_id, last + 1, size)
        db.execute(
            "UPDATE logs SET next_seq = ?, oldest_seq = ?, bytes = ? WHERE id = ?",
            (last + 1, oldest, size, response_id),
        )

    def _trim(
        self, db: sqlite3.Connection, response_id: str, next_seq: int, size: int
    ) -> tuple[int, int]:
        """Keep about the newest ``replay_events`` events and ``replay_bytes`` bytes,
        whole batches at a time, always the newest batch. Returns the oldest retained
        sequence number and the bytes retained."""
        dropped = db.execute(
            "DELETE FROM log_batches WHERE id = ? AND last_seq < ? RETURNING bytes",
            (response_id, next_seq - self._replay_events),
        ).fetchall()
        size -= sum(row[0] for row in dropped)
        while size > self._replay_bytes:
            rowid, last_seq, batch_bytes = db.execute(
                "SELECT rowid, last_seq, bytes FROM log_batches WHERE id = ?"
                " ORDER BY last_seq LIMIT 1",
                (response_id,),
            ).fetchone()
            if last_seq == next_seq - 1:
                break  # the newest batch stays, however large
            db.execute("DELETE FROM log_batches WHERE rowid = ?", (rowid,))
            size -= batch_bytes
        (oldest,) = db.execute(
            "SELECT first_seq FROM log_batches WHERE id = ? ORDER BY last_seq LIMIT 1",
            (response_id,),
        ).fetchone()
        return oldest, size

    async def finish(self, response_id: str, log: EventLog, *, owner: str | None) -> None:
        # ``log`` is not needed: its frames, the terminal one last, were appended.
        def work() -> None:
            with self._db.transaction() as db:
                self._complete_log(db, response_id)

        await self._db.run(work)

    async def terminate(self, record: StoredResponse) -> None:
        def work() -> None:
            with self._db.transaction() as db:
                self.terminate_in(db, record)

        await self._db.run(work)

    def terminate_in(self, db: sqlite3.Connection, record: StoredResponse) -> None:
        """`terminate`, inside the caller's transaction (worker thread)."""
        meta = db.execute(
            "SELECT next_seq, complete FROM logs WHERE id = ?", (record.id,)
        ).fetchone()
        if meta is None or meta[1]:
            return
        if not self._ends_with_terminal(db, record.id):
            frame = terminal_frame(record.response, meta[0])
            self._append(db, record.id, [frame], meta[0], record.owner)
        self._complete_log(db, record.id)

    @staticmethod
    def _ends_with_terminal(db: sqlite3.Connection, response_id: str) -> bool:
        last = db.execute(
            "SELECT frames FROM log_batches WHERE id = ? ORDER BY last_seq DESC LIMIT 1",
            (response_id,),
        ).fetchone()
        return last is not None and is_terminal_frame(_split(last[0])[-1])

    def seal_orphans(self) -> None:
        """End the unfinished logs a dead process left whose record is no longer running
        (it died between the record's last write and `finish`). Worker thread, at open:
        then no job of this process runs yet. Logs of running records are recovery's."""
        with self._db.transaction() as db:
            orphans = db.execute(
                "SELECT logs.id, responses.expires_at IS NULL, responses.response,"
                " responses.owner FROM logs LEFT JOIN responses ON responses.id = logs.id"
                " WHERE NOT logs.complete"
            ).fetchall()
            for response_id, running, response, owner in orphans:
                if response is None:
                    self._drop(db, [response_id])  # nobody can ask for it any more
                elif not running:
                    try:
                        self.terminate_in(db, StoredResponse(decode_json(response), [], owner))
                    except (ValueError, KeyError):
                        self._drop(db, [response_id])  # a record it cannot end: unreadable

    def _complete_log(self, db: sqlite3.Connection, response_id: str) -> None:
        """Mark the log complete, finished now; then keep within the retention limits."""
        if self._retention_s <= 0:
            # Nothing is retained after the end: forget the log at once.
            self._drop(db, [response_id])
            return
        row = db.execute(
            "UPDATE logs SET complete = 1, finished_at = ? WHERE id = ? AND NOT complete"
            " RETURNING bytes",
            (self._clock(), response_id),
        ).fetchone()
        if row is None:
            return
        self._complete += 1
        self._complete_bytes += row[0]
        if self._complete > self._max_streams or self._complete_bytes > self._max_bytes:
            self._enforce_retention(db)

    def _enforce_retention(self, db: sqlite3.Connection) -> None:
        """Drop the oldest complete logs beyond the count and byte limits (the newest
        stays, however large)."""
        count, size = self._complete, self._complete_bytes
        dropped: list[str] = []
        oldest_first = db.execute(
            "SELECT id, bytes FROM logs WHERE complete ORDER BY finished_at, rowid"
        )
        for response_id, log_bytes in oldest_first:
            if count <= self._max_streams and (size <= self._max_bytes or count <= 1):
                break
            dropped.append(response_id)
            count -= 1
            size -= log_bytes
        oldest_first.close()  # before deleting from the table it reads
        self._drop(db, dropped)

    def _drop(self, db: sqlite3.Connection, response_ids: Sequence[str]) -> None:
        """Forget logs, complete or not (and count what was complete)."""
        for response_id in response_ids:
            db.execute("DELETE FROM log_batches WHERE id = ?", (response_id,))
            row = db.execute(
                "DELETE FROM logs WHERE id = ? RETURNING complete, bytes", (response_id,)
            ).fetchone()
            if row is not None and row[0]:
                self._complete -= 1
                self._complete_bytes -= row[1]

    async def delete(self, response_id: str, *, owner: str | None) -> None:
        def work() -> None:
            with self._db.transaction() as db:
                self._drop(db, [response_id])

        await self._db.run(work)

    async def expire(self) -> int:
        if math.isinf(self._retention_s):
            await trio.lowlevel.checkpoint()
            return 0

        def work() -> int:
            with self._db.transaction() as db:
                rows = db.execute(
                    "SELECT id FROM logs WHERE complete AND finished_at <= ?",
                    (self._clock() - self._retention_s,),
                ).fetchall()
                self._drop(db, [row[0] for row in rows])
            return len(rows)

        return await self._db.run(work)

    # -- reading -----------------------------------------------------------------------

    async def open(
        self, response_id: str, *, owner: str | None, starting_after: int
    ) -> Subscription | None:
        def work() -> tuple[int, int, bool] | None:
            row = self._db.connection.execute(
                "SELECT next_seq, oldest_seq, complete FROM logs WHERE id = ? AND owner IS ?",
                (response_id, owner),
            ).fetchone()
            return None if row is None else (row[0], row[1], bool(row[2]))

        meta = await self._db.run(work)
        if meta is None:
            return None
        next_seq, oldest, complete = meta
        if starting_after + 1 < oldest:
            raise SubscriberLagged(starting_after + 1, oldest)
        reader = _SqliteLogReader(self._db, response_id, next_seq)
        if complete:
            reader.completed(next_seq)
        return ReaderSubscription(reader, starting_after)


@final
class _SqliteLogReader:
    """Implements `LogReader` for one stored log."""

    def __init__(self, db: Database, response_id: str, next_seq: int) -> None:
        self._db = db
        self._id = response_id
        self._next_seq = next_seq
        self._last: int | None = None

    def completed(self, next_seq: int) -> None:
        self._next_seq = next_seq
        self._last = next_seq - 1

    def complete_through(self) -> int | None:
        return self._last

    def close(self) -> None:
        pass  # holds nothing between reads

    async def read_after(self, cursor: int) -> list[bytes]:
        if self._last is not None and cursor >= self._last:
            await trio.lowlevel.checkpoint()
            return []
        meta, frames = await self._db.run(lambda: self._read(cursor))
        if meta is None:
            # Deleted or dropped by retention while being read.
            raise SubscriberLagged(cursor + 1, max(self._next_seq, cursor + 2))
        next_seq, oldest, complete = meta
        if cursor + 1 < oldest:
            raise SubscriberLagged(cursor + 1, oldest)
        if complete:
            self.completed(next_seq)
        else:
            self._next_seq = next_seq
            if not frames:
                await trio.sleep(_INCOMPLETE_POLL_S)
        return frames

    def _read(self, cursor: int) -> tuple[tuple[int, int, bool] | None, list[bytes]]:
        db = self._db.connection
        # One read transaction: the meta row and the batches agree.
        db.execute("BEGIN")
        try:
            row = db.execute(
                "SELECT next_seq, oldest_seq, complete FROM logs WHERE id = ?", (self._id,)
            ).fetchone()
            if row is None or cursor + 1 < row[1]:
                return (None if row is None else (row[0], row[1], bool(row[2]))), []
            frames: list[bytes] = []
            size = 0
            # The index on (id, last_seq) finds the first batch holding cursor + 1.
            batches = db.execute(
                "SELECT first_seq, frames FROM log_batches WHERE id = ? AND last_seq > ?"
                " ORDER BY last_seq",
                (self._id, cursor),
            )
            for first_seq, batch in batches:
                for frame in _split(batch)[max(0, cursor + 1 - first_seq) :]:
                    if frames and size + len(frame) > _READ_BATCH_BYTES:
                        return (row[0], row[1], bool(row[2])), frames
                    frames.append(frame)
                    size += len(frame)
            return (row[0], row[1], bool(row[2])), frames
        finally:
            db.execute("COMMIT")
