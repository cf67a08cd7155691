"""``sqlite:///PATH``: the state layer in one SQLite file, surviving restarts.

This module owns the file's schema and everything written to it:

- `SqliteStore`: response records (owner-scoped), finished ones bounded by
  count and bytes per tenant (`StoreLimits`) and by time to live; running ones
  kept until they finish.
- `SqliteConversations`: conversations and their items (owner-scoped), bounded
  per tenant like finished records, with a time to live after their last use.
- `SqliteEventLogs`: the event logs of background responses, written batch by
  batch while the job runs (``live``), kept after the job ends within the
  retention limits, and replayed from any retained cursor, also after a restart.
- `open_sqlite_state`: opens the file and creates or migrates the schema,
  watches that the path still names that file, and closes it on exit. Control
  is `LocalControl`: one process owns the file, so every job runs here or nowhere.

The file itself (the one-process lock, WAL without a memory-mapped index, the
watch on its identity) is `sqlite_file`'s. Every statement runs in a worker
thread, on one connection, one operation at a time (a `trio.CapacityLimiter` of
1): the Trio thread never blocks on the disk.

Schema (``PRAGMA user_version`` = `SCHEMA_VERSION`; older files are migrated)::

    responses(id PK, owner, status, replica, response JSON, input_items JSON,
              updated_at, expires_at NULL while running, bytes = `record_bytes`)
    logs(id PK, owner, next_seq, oldest_seq, bytes, complete, finished_at)
    log_batches(id, first_seq, last_seq, bytes, frames, UNIQUE(id, last_seq))
    response_items(item_id, response_id)  kept by triggers on responses (v3)
    conversations(id PK, owner, conversation JSON, expires_at, bytes, holder, lock_until)
    conversation_items(seq PK, conversation_id, id, item JSON, bytes)  (v3)

A batch is the frames of one `SqliteEventLogs.append` call, concatenated: each
SSE frame ends with ``\\n\\n`` and holds no other, so the batch splits back.
"""

from __future__ import annotations

import json
import logging
import math
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, final

import trio

from .._config import Config
from ..background.event_log import EventLog, SubscriberLagged
from ..background.subscription import ReaderSubscription, Subscription
from ..protocol.builder import terminal_frame
from ..protocol.sse import is_terminal_frame, split_frames
from .base import (
    RUNNING_STATUSES,
    ConversationFull,
    LogStatistics,
    State,
    StoredConversation,
    StoredResponse,
    StoreError,
    StoreLimits,
    encoded,
)
from .memory import LocalControl
from .sqlite_file import Database, open_database

logger = logging.getLogger(__name__)

SCHEMA_VERSION = 3

_ITEM_INDEX = """
CREATE TABLE IF NOT EXISTS response_items (
    item_id     TEXT NOT NULL,
    response_id TEXT NOT NULL,
    PRIMARY KEY (item_id, response_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS response_items_response ON response_items (response_id);
"""
"""Item id -> the finished records holding it (`SqliteStore.find_item`); the
triggers in `_SCHEMA` keep it as records are written and deleted."""

_INDEX_ITEMS_OF = """
INSERT OR IGNORE INTO response_items
    SELECT json_extract(value, '$.id'), {row}.id FROM json_each({row}.input_items)
        WHERE json_extract(value, '$.id') IS NOT NULL
    UNION SELECT json_extract(value, '$.id'), {row}.id FROM json_each({row}.response, '$.output')
        WHERE json_extract(value, '$.id') IS NOT NULL
"""

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS responses (
    id          TEXT PRIMARY KEY,
    owner       TEXT,
    status      TEXT NOT NULL,
    replica     TEXT,
    response    TEXT NOT NULL,
    input_items TEXT NOT NULL,
    updated_at  REAL NOT NULL,
    expires_at  REAL,
    bytes       INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS responses_finished
    ON responses (expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS responses_owner_finished
    ON responses (owner, expires_at) WHERE expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS responses_running
    ON responses (replica) WHERE expires_at IS NULL;

CREATE TABLE IF NOT EXISTS logs (
    id          TEXT PRIMARY KEY,
    owner       TEXT,
    next_seq    INTEGER NOT NULL,
    oldest_seq  INTEGER NOT NULL,
    bytes       INTEGER NOT NULL,
    complete    INTEGER NOT NULL DEFAULT 0,
    finished_at REAL
);
CREATE INDEX IF NOT EXISTS logs_complete ON logs (finished_at) WHERE complete;

CREATE TABLE IF NOT EXISTS log_batches (
    id        TEXT NOT NULL,
    first_seq INTEGER NOT NULL,
    last_seq  INTEGER NOT NULL,
    bytes     INTEGER NOT NULL,
    frames    BLOB NOT NULL,
    UNIQUE (id, last_seq)
);
"""
    + _ITEM_INDEX
    + """
-- A REPLACE deletes without firing delete triggers: the insert trigger starts afresh.
CREATE TRIGGER IF NOT EXISTS responses_index_items AFTER INSERT ON responses
WHEN NEW.expires_at IS NOT NULL BEGIN
    DELETE FROM response_items WHERE response_id = NEW.id;
"""
    + _INDEX_ITEMS_OF.format(row="NEW")
    + """;
END;
CREATE TRIGGER IF NOT EXISTS responses_unindex_items AFTER DELETE ON responses BEGIN
    DELETE FROM response_items WHERE response_id = OLD.id;
END;

CREATE TABLE IF NOT EXISTS conversations (
    id           TEXT PRIMARY KEY,
    owner        TEXT,
    conversation TEXT NOT NULL,
    expires_at   REAL NOT NULL,
    bytes        INTEGER NOT NULL,
    holder       TEXT,
    lock_until   REAL
);
CREATE INDEX IF NOT EXISTS conversations_owner ON conversations (owner, expires_at);
CREATE INDEX IF NOT EXISTS conversations_expiry ON conversations (expires_at);

CREATE TABLE IF NOT EXISTS conversation_items (
    seq             INTEGER PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    id              TEXT NOT NULL,
    item            TEXT NOT NULL,
    bytes           INTEGER NOT NULL,
    UNIQUE (conversation_id, id)
);
CREATE INDEX IF NOT EXISTS conversation_items_id ON conversation_items (id);
CREATE TRIGGER IF NOT EXISTS conversations_drop_items AFTER DELETE ON conversations BEGIN
    DELETE FROM conversation_items WHERE conversation_id = OLD.id;
END;
"""
)

_MIGRATIONS = {
    1: """
ALTER TABLE responses ADD COLUMN bytes INTEGER NOT NULL DEFAULT 0;
UPDATE responses SET bytes = length(CAST(response AS BLOB)) + length(CAST(input_items AS BLOB));
""",
    2: _ITEM_INDEX
    + _INDEX_ITEMS_OF.format(row="responses")
    .replace("FROM json_each", "FROM responses, json_each")
    .replace("WHERE json_extract", "WHERE responses.expires_at IS NOT NULL AND json_extract")
    + ";",
}
"""The statements that bring a file of schema version N to N + 1."""

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
class SqliteStore:
    """Implements `ResponseStore` in the ``responses`` table."""

    def __init__(
        self,
        db: Database,
        *,
        replica: str,
        limits: StoreLimits,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
        logs: SqliteEventLogs | None = None,
    ) -> None:
        if limits.max_responses < 1 or limits.max_bytes < 1:
            raise ValueError("the store's bounds must be >= 1")
        self._db = db
        self._logs = logs
        self._replica = replica
        self._limits = limits
        self._ttl = ttl_s
        self._clock = clock
        # Finished records in the file and their bytes, by tenant, so that a put knows
        # without a query whether to evict. Exact: this process is the file's only
        # writer. Worker thread only (re-read after a rollback).
        self._shares: dict[str | None, list[int]] = {}
        db.reloads.append(self.load)

    def load(self) -> None:
        """Read the counters (worker thread, at open)."""
        rows = self._db.connection.execute(
            "SELECT owner, count(*), sum(bytes) FROM responses WHERE expires_at IS NOT NULL"
            " GROUP BY owner"
        ).fetchall()
        self._shares = {}
        for owner, count, size in rows:
            self._count(self._limits.tenant(owner), int(count), int(size))

    def _count(self, tenant: str | None, count: int, size: int) -> None:
        """Add ``count`` finished records of ``size`` bytes to a tenant's counters."""
        share = self._shares.setdefault(tenant, [0, 0])
        share[0] += count
        share[1] += size
        if share[0] <= 0:
            del self._shares[tenant]

    async def put(self, record: StoredResponse) -> None:
        await self._db.run(lambda: self._put_many([record]))

    def _put_many(self, records: Sequence[StoredResponse], *, terminate_logs: bool = False) -> None:
        now = self._clock()
        rows = []
        for record in records:
            response, input_items = encoded(record.response), encoded(record.input_items)
            rows.append(
                (
                    record.id,
                    record.owner,
                    record.status,
                    record.replica,
                    response,
                    input_items,
                    now,
                    None if record.running else now + self._ttl,
                    len(response.encode()) + len(input_items.encode()),  # `record_bytes`
                )
            )
        with self._db.transaction() as db:
            tenants: set[str | None] = set()
            for row in rows:
                old = db.execute(
                    "SELECT owner, bytes FROM responses WHERE id = ? AND expires_at IS NOT NULL",
                    (row[0],),
                ).fetchone()
                if old is not None:
                    self._count(self._limits.tenant(old[0]), -1, -old[1])
                # REPLACE gives the row a new rowid: the newest write sorts last.
                db.execute(
                    "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", row
                )
                if row[7] is not None:
                    tenant = self._limits.tenant(row[1])
                    self._count(tenant, 1, row[8])
                    tenants.add(tenant)
            for tenant in tenants:
                self._evict(db, tenant)
            if terminate_logs and self._logs is not None:
                # The same transaction ends their logs: a crash cannot leave a failed
                # record whose log never ends (recovery would not see it again).
                for record in records:
                    self._logs.terminate_in(db, record)

    def _evict(self, db: sqlite3.Connection, tenant: str | None) -> None:
        """Delete the tenant's oldest finished records beyond its share (worker thread)."""
        count, size = self._shares.get(tenant, (0, 0))
        if not self._limits.over(count, size):
            return
        # Oldest stored first (the TTL is the same for all: expires_at orders by age).
        if self._limits.per_owner:
            oldest_first = db.execute(
                "SELECT rowid, bytes FROM responses WHERE expires_at IS NOT NULL"
                " AND owner IS ? ORDER BY expires_at, rowid",
                (tenant,),
            )
        else:
            oldest_first = db.execute(
                "SELECT rowid, bytes FROM responses WHERE expires_at IS NOT NULL"
                " ORDER BY expires_at, rowid"
            )
        evicted: list[tuple[int]] = []
        evicted_bytes = 0
        for rowid, row_bytes in oldest_first:
            if not self._limits.over(count - len(evicted), size - evicted_bytes):
                break
            evicted.append((rowid,))
            evicted_bytes += row_bytes
        oldest_first.close()  # before deleting from the table it reads
        db.executemany("DELETE FROM responses WHERE rowid = ?", evicted)
        self._count(tenant, -len(evicted), -evicted_bytes)

    async def get(self, response_id: str, *, owner: str | None) -> StoredResponse | None:
        def work() -> StoredResponse | None:
            row = self._db.connection.execute(
                "SELECT response, input_items, replica, updated_at FROM responses"
                " WHERE id = ? AND owner IS ? AND (expires_at IS NULL OR expires_at > ?)",
                (response_id, owner, self._clock()),
            ).fetchone()
            if row is None:
                return None
            # Decoded here: a long conversation's JSON is too much for the event loop.
            return StoredResponse(
                response=json.loads(row[0]),
                input_items=json.loads(row[1]),
                owner=owner,
                replica=row[2],
                updated_at=row[3],
            )

        return await self._db.run(work)

    async def delete(self, response_id: str, *, owner: str | None) -> bool:
        def work() -> bool:
            with self._db.transaction() as db:
                row = db.execute(
                    "DELETE FROM responses WHERE id = ? AND owner IS ? RETURNING expires_at, bytes",
                    (response_id, owner),
                ).fetchone()
                if row is None:
                    return False
                expires_at: float | None = row[0]
                if expires_at is None:
                    return True
                self._count(self._limits.tenant(owner), -1, -row[1])
            # Expired but not yet collected: it was already gone for readers.
            return expires_at > self._clock()

        return await self._db.run(work)

    async def expire(self) -> int:
        def work() -> int:
            with self._db.transaction() as db:
                expired = db.execute(
                    "DELETE FROM responses WHERE expires_at <= ? RETURNING owner, bytes",
                    (self._clock(),),
                ).fetchall()
                for owner, row_bytes in expired:
                    self._count(self._limits.tenant(owner), -1, -row_bytes)
            return len(expired)

        return await self._db.run(work)

    async def recover_interrupted(self) -> list[StoredResponse]:
        def work() -> list[StoredResponse]:
            statuses = sorted(RUNNING_STATUSES)
            rows = self._db.connection.execute(
                "SELECT response, input_items, owner, replica FROM responses"
                " WHERE expires_at IS NULL AND replica IS NOT ?"
                f" AND status IN ({', '.join('?' * len(statuses))})",
                (self._replica, *statuses),
            ).fetchall()
            # One process per file: a running record of any other replica was left by
            # a process that is gone. This process's own running jobs are never touched.
            recovered = [
                StoredResponse(
                    response=json.loads(row[0]),
                    input_items=json.loads(row[1]),
                    owner=row[2],
                    replica=row[3],
                ).interrupted()
                for row in rows
            ]
            if recovered:
                self._put_many(recovered, terminate_logs=True)
            return recovered

        records = await self._db.run(work)
        if records:
            logger.info("marked %d interrupted responses failed (server_restarted)", len(records))
        return records

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        def work() -> dict[str, Any] | None:
            rows = self._db.connection.execute(
                "SELECT responses.response, responses.input_items FROM response_items"
                " JOIN responses ON responses.id = response_items.response_id"
                " WHERE response_items.item_id = ? AND responses.owner IS ?"
                " AND responses.expires_at > ? ORDER BY responses.rowid DESC LIMIT 1",
                (item_id, owner, self._clock()),
            ).fetchall()
            for response, input_items in rows:
                record = StoredResponse(json.loads(response), json.loads(input_items), owner)
                return record.item(item_id)
            return None

        return await self._db.run(work)


@final
class SqliteConversations:
    """Implements `ConversationStore` in the ``conversations`` and
    ``conversation_items`` tables."""

    def __init__(
        self,
        db: Database,
        *,
        limits: StoreLimits,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db = db
        self._limits = limits
        self._ttl = ttl_s
        self._clock = clock

    def _live(self, db: sqlite3.Connection, conversation_id: str, owner: str | None) -> bool:
        """Whether the conversation is ``owner``'s and unexpired; if so, marks it used
        (inside the caller's transaction)."""
        now = self._clock()
        row = db.execute(
            "UPDATE conversations SET expires_at = ? WHERE id = ? AND owner IS ?"
            " AND expires_at > ? RETURNING id",
            (now + self._ttl, conversation_id, owner, now),
        ).fetchone()
        return row is not None

    def _evict(self, db: sqlite3.Connection, conversation_id: str, owner: str | None) -> None:
        """Drop the tenant's least recently used conversations beyond its share (not
        ``conversation_id``)."""
        if self._limits.per_owner:
            rows = db.execute(
                "SELECT id, bytes FROM conversations WHERE owner IS ?"
                " ORDER BY expires_at DESC, rowid DESC",
                (owner,),
            ).fetchall()
        else:
            rows = db.execute(
                "SELECT id, bytes FROM conversations ORDER BY expires_at DESC, rowid DESC"
            ).fetchall()
        count, size = len(rows), sum(row[1] for row in rows)
        dropped: list[tuple[str]] = []
        for key, row_bytes in reversed(rows):
            if not self._limits.over(count, size) or key == conversation_id:
                break
            dropped.append((key,))
            count -= 1
            size -= row_bytes
        db.executemany("DELETE FROM conversations WHERE id = ?", dropped)

    @staticmethod
    def _add(
        db: sqlite3.Connection, conversation_id: str, items: Sequence[dict[str, Any]]
    ) -> list[dict[str, Any]]:
        added = []
        for item in items:
            text = encoded(item)
            size = len(text.encode())
            inserted = db.execute(
                "INSERT OR IGNORE INTO conversation_items (conversation_id, id, item, bytes)"
                " VALUES (?, ?, ?, ?) RETURNING bytes",
                (conversation_id, item["id"], text, size),
            ).fetchone()
            if inserted is not None:
                db.execute(
                    "UPDATE conversations SET bytes = bytes + ? WHERE id = ?",
                    (size, conversation_id),
                )
                added.append(item)
        return added

    async def create(
        self, conversation: StoredConversation, items: Sequence[dict[str, Any]]
    ) -> None:
        text = encoded(conversation.conversation)

        def work() -> None:
            with self._db.transaction() as db:
                db.execute(
                    "INSERT INTO conversations (id, owner, conversation, expires_at, bytes)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (
                        conversation.id,
                        conversation.owner,
                        text,
                        self._clock() + self._ttl,
                        len(text.encode()),
                    ),
                )
                self._add(db, conversation.id, items)
                self._evict(db, conversation.id, conversation.owner)

        await self._db.run(work)

    async def get(self, conversation_id: str, *, owner: str | None) -> StoredConversation | None:
        def work() -> StoredConversation | None:
            with self._db.transaction() as db:
                if not self._live(db, conversation_id, owner):
                    return None
                (text,) = db.execute(
                    "SELECT conversation FROM conversations WHERE id = ?", (conversation_id,)
                ).fetchone()
            return StoredConversation(json.loads(text), owner)

        return await self._db.run(work)

    async def update(
        self, conversation_id: str, metadata: dict[str, str], *, owner: str | None
    ) -> StoredConversation | None:
        def work() -> StoredConversation | None:
            with self._db.transaction() as db:
                if not self._live(db, conversation_id, owner):
                    return None
                (text,) = db.execute(
                    "SELECT conversation FROM conversations WHERE id = ?", (conversation_id,)
                ).fetchone()
                conversation = {**json.loads(text), "metadata": metadata}
                new = encoded(conversation)
                db.execute(
                    "UPDATE conversations SET conversation = ?, bytes = bytes + ? WHERE id = ?",
                    (new, len(new.encode()) - len(text.encode()), conversation_id),
                )
                self._evict(db, conversation_id, owner)
            return StoredConversation(conversation, owner)

        return await self._db.run(work)

    async def delete(self, conversation_id: str, *, owner: str | None) -> bool:
        def work() -> bool:
            with self._db.transaction() as db:
                row = db.execute(
                    "DELETE FROM conversations WHERE id = ? AND owner IS ? RETURNING expires_at",
                    (conversation_id, owner),
                ).fetchone()
            return row is not None and row[0] > self._clock()

        return await self._db.run(work)

    async def items(
        self, conversation_id: str, *, owner: str | None
    ) -> list[dict[str, Any]] | None:
        def work() -> list[dict[str, Any]] | None:
            with self._db.transaction() as db:
                if not self._live(db, conversation_id, owner):
                    return None
                rows = db.execute(
                    "SELECT item FROM conversation_items WHERE conversation_id = ? ORDER BY seq",
                    (conversation_id,),
                ).fetchall()
            return [json.loads(row[0]) for row in rows]

        return await self._db.run(work)

    async def add_items(
        self,
        conversation_id: str,
        items: Sequence[dict[str, Any]],
        *,
        owner: str | None,
        max_items: int | None = None,
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]] | None:
        def work() -> list[dict[str, Any]] | None:
            with self._db.transaction() as db:
                if not self._live(db, conversation_id, owner):
                    return None
                (held_bytes,) = db.execute(
                    "SELECT bytes FROM conversations WHERE id = ?", (conversation_id,)
                ).fetchone()
                if max_items is not None:
                    ids = {item["id"] for item in items}
                    held, present = db.execute(
                        "SELECT count(*), count(*) FILTER (WHERE id IN (SELECT value FROM"
                        " json_each(?))) FROM conversation_items WHERE conversation_id = ?",
                        (json.dumps(sorted(ids)), conversation_id),
                    ).fetchone()
                    if held + len(ids) - present > max_items:
                        raise ConversationFull(held)
                added = self._add(db, conversation_id, items)
                if max_bytes is not None:
                    (size,) = db.execute(
                        "SELECT bytes FROM conversations WHERE id = ?", (conversation_id,)
                    ).fetchone()
                    if size > max_bytes:
                        (held,) = db.execute(
                            "SELECT count(*) FROM conversation_items WHERE conversation_id = ?",
                            (conversation_id,),
                        ).fetchone()
                        # Raised inside the transaction: it is rolled back, nothing added.
                        raise ConversationFull(held - len(added), held_bytes=held_bytes)
                self._evict(db, conversation_id, owner)
            return added

        return await self._db.run(work)

    async def get_item(
        self, conversation_id: str, item_id: str, *, owner: str | None
    ) -> dict[str, Any] | None:
        def work() -> dict[str, Any] | None:
            with self._db.transaction() as db:
                if not self._live(db, conversation_id, owner):
                    return None
                row = db.execute(
                    "SELECT item FROM conversation_items WHERE conversation_id = ? AND id = ?",
                    (conversation_id, item_id),
                ).fetchone()
            return None if row is None else json.loads(row[0])

        return await self._db.run(work)

    async def delete_item(self, conversation_id: str, item_id: str, *, owner: str | None) -> bool:
        def work() -> bool:
            with self._db.transaction() as db:
                if not self._live(db, conversation_id, owner):
                    return False
                row = db.execute(
                    "DELETE FROM conversation_items WHERE conversation_id = ? AND id = ?"
                    " RETURNING bytes",
                    (conversation_id, item_id),
                ).fetchone()
                if row is None:
                    return False
                db.execute(
                    "UPDATE conversations SET bytes = bytes - ? WHERE id = ?",
                    (row[0], conversation_id),
                )
            return True

        return await self._db.run(work)

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        def work() -> dict[str, Any] | None:
            row = self._db.connection.execute(
                "SELECT conversation_items.item FROM conversation_items"
                " JOIN conversations ON conversations.id = conversation_items.conversation_id"
                " WHERE conversation_items.id = ? AND conversations.owner IS ?"
                " AND conversations.expires_at > ? ORDER BY conversation_items.seq DESC LIMIT 1",
                (item_id, owner, self._clock()),
            ).fetchone()
            return None if row is None else json.loads(row[0])

        return await self._db.run(work)

    async def lock(
        self, conversation_id: str, holder: str, *, owner: str | None, lease_s: float
    ) -> bool | None:
        def work() -> bool | None:
            with self._db.transaction() as db:
                if not self._live(db, conversation_id, owner):
                    return None
                now = self._clock()
                row = db.execute(
                    "UPDATE conversations SET holder = ?, lock_until = ? WHERE id = ?"
                    " AND (holder IS NULL OR holder = ? OR lock_until <= ?) RETURNING id",
                    (holder, now + lease_s, conversation_id, holder, now),
                ).fetchone()
            return row is not None

        return await self._db.run(work)

    async def unlock(self, conversation_id: str, holder: str) -> None:
        def work() -> None:
            with self._db.transaction() as db:
                db.execute(
                    "UPDATE conversations SET holder = NULL, lock_until = NULL"
                    " WHERE id = ? AND holder = ?",
                    (conversation_id, holder),
                )

        await self._db.run(work)

    async def expire(self) -> int:
        def work() -> int:
            with self._db.transaction() as db:
                rows = db.execute(
                    "DELETE FROM conversations WHERE expires_at <= ? RETURNING id",
                    (self._clock(),),
                ).fetchall()
            return len(rows)

        return await self._db.run(work)


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
                        self.terminate_in(db, StoredResponse(json.loads(response), [], owner))
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

    async def delete(self, response_id: str) -> None:
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


def _prepare(connection: sqlite3.Connection, path: str) -> None:
    """Create the schema, or migrate an older file's (worker thread, at open)."""
    try:
        (version,) = connection.execute("PRAGMA user_version").fetchone()
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"SQLite store {path} has schema version {version}; this trio-responses "
                f"understands up to {SCHEMA_VERSION} (written by a newer version?)"
            )
        # A new file (version 0) gets the schema as it is; an older one its migrations.
        steps = "".join(_MIGRATIONS[step] for step in range(version, SCHEMA_VERSION) if version)
        connection.executescript(
            f"BEGIN; {steps} {_SCHEMA} PRAGMA user_version = {SCHEMA_VERSION}; COMMIT;"
        )
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"cannot open SQLite store {path}: {exc} (not a trio-responses database?)"
        ) from exc


@asynccontextmanager
async def open_sqlite_state(
    path: str, config: Config, *, clock: Callable[[], float] = time.time
) -> AsyncIterator[State]:
    """The ``sqlite:///PATH`` backend; closes the file and releases its lock on exit.

    ``clock`` is the wall clock of expiry times (they outlive the process).

    Raises:
        StoreError: the file cannot be opened, is not a database of ours, or
            another process uses it.
    """
    db = await trio.to_thread.run_sync(
        open_database, path, lambda connection: _prepare(connection, path)
    )
    control = LocalControl()
    logs = SqliteEventLogs(
        db,
        replay_events=config.replay_events,
        replay_bytes=config.replay_bytes,
        retention_s=config.stream_retention_s,
        max_streams=config.max_retained_streams,
        max_bytes=config.retained_stream_bytes,
        clock=clock,
    )
    store = SqliteStore(
        db,
        replica=control.replica,
        limits=StoreLimits.of(config),
        ttl_s=config.store_ttl_s,
        clock=clock,
        logs=logs,
    )
    try:

        def load() -> None:
            store.load()
            logs.load()
            logs.seal_orphans()

        await db.run(load)
        conversations = SqliteConversations(
            db, limits=StoreLimits.of(config), ttl_s=config.store_ttl_s, clock=clock
        )
        async with trio.open_nursery() as nursery:
            nursery.start_soon(db.watch)
            try:
                yield State(
                    kind="sqlite",
                    store=store,
                    logs=logs,
                    control=control,
                    conversations=conversations,
                    fault=lambda: db.fault,
                )
            finally:
                nursery.cancel_scope.cancel()
    finally:
        with trio.move_on_after(config.cleanup_timeout_s, shield=True) as scope:
            try:
                await db.close()
            except StoreError as exc:
                logger.warning("closing %s: %s", path, exc)
        if scope.cancelled_caught:
            logger.warning(
                "closing %s took over %.1f s; lock released anyway", path, config.cleanup_timeout_s
            )
        db.release()  # the flock
