"""Response records and conversations in SQLite."""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, final

from ...protocol.codec import decode_json, encode_ascii_json
from ..base import (
    RUNNING_STATUSES,
    ConversationFull,
    StoredConversation,
    StoredResponse,
    StoreLimits,
    encoded,
)
from ..webhooks import terminal_event
from ._file import Database
from ._logs import SqliteEventLogs
from ._webhooks import SqliteWebhooks

logger = logging.getLogger("trio_responses.store.sqlite")


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
        webhooks: SqliteWebhooks | None = None,
    ) -> None:
        if limits.max_responses < 1 or limits.max_bytes < 1:
            raise ValueError("the store's bounds must be >= 1")
        self._db = db
        self._logs = logs
        self._webhooks = webhooks
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
            for record, row in zip(records, rows, strict=True):
                old = db.execute(
                    "SELECT owner, bytes, expires_at FROM responses WHERE id = ?", (row[0],)
                ).fetchone()
                finished = old is not None and old[2] is not None
                if finished:
                    self._count(self._limits.tenant(old[0]), -1, -old[1])
                elif row[7] is not None:
                    # A finished record is final: only the write that ends it makes an event.
                    self._enqueue(db, record)
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

    def _enqueue(self, db: sqlite3.Connection, record: StoredResponse) -> None:
        """Write the deliveries of the event that ending ``record`` makes, if any
        (inside the caller's transaction: with the final record or not at all)."""
        if self._webhooks is None:
            return
        now = time.time()  # the outbox's times are wall clock (replicas share them)
        event = terminal_event(record.response, record.owner, now=now)
        if event is not None:
            self._webhooks.enqueue_in(db, event, now=now)

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
                response=decode_json(row[0]),
                input_items=decode_json(row[1]),
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
                    response=decode_json(row[0]),
                    input_items=decode_json(row[1]),
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
                record = StoredResponse(decode_json(response), decode_json(input_items), owner)
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
            return StoredConversation(decode_json(text), owner)

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
                conversation = {**decode_json(text), "metadata": metadata}
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
            return [decode_json(row[0]) for row in rows]

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
                        (encode_ascii_json(sorted(ids)), conversation_id),
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
            return None if row is None else decode_json(row[0])

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
            return None if row is None else decode_json(row[0])

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

    async def unlock(self, conversation_id: str, holder: str, *, owner: str | None) -> None:
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
