"""Webhook endpoints and the outbox of deliveries in SQLite (``webhook_endpoints``,
``webhook_deliveries``).

Each method is one transaction (or one read) on the connection's worker thread:
a claim reads the due deliveries and leases those it takes in one transaction
(holding the write lock from its start), so of two claims neither sees the
other's half. `SqliteWebhooks.enqueue_in` is what
`SqliteStore` calls inside the transaction that writes a background response's
final record: the record and its deliveries are committed together or not at all.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any, final

from ...protocol.codec import decode_json
from ..base import encoded
from ..webhooks import (
    CLAIM_SCAN,
    MAX_ENDPOINTS,
    MAX_SETTLED,
    OPERATOR,
    Delivery,
    EndpointsFull,
    StoredEndpoint,
    WebhookEvent,
    deliveries_for,
)
from ._file import Database

__all__ = ["SqliteWebhooks"]

_ENDPOINT = "endpoint, owner, secret, previous_secret, previous_until"
"""The columns `_endpoint` reads, in its order."""

_DELIVERY = (
    "event_id, event_type, response_id, event_created_at, event_owner, endpoint_id,"
    " endpoint_owner, status, attempts, next_attempt_at, updated_at, last_error,"
    " status_code, leased_by, lease_until"
)
"""The columns `_delivery` reads, in its order."""


def _endpoint(row: Sequence[Any]) -> StoredEndpoint:
    endpoint: dict[str, Any] = decode_json(row[0])
    return StoredEndpoint(endpoint, row[1], row[2], row[3], row[4])


def _delivery(row: Sequence[Any]) -> Delivery:
    event = WebhookEvent(row[0], row[1], row[2], row[3], row[4])
    return Delivery(event, *row[5:])


@final
class SqliteWebhooks:
    """Implements `WebhookStore` in the ``webhook_endpoints`` and
    ``webhook_deliveries`` tables. Endpoint ids are unique in the file (the
    server makes them at random); a lookup matches the owner too."""

    def __init__(self, db: Database) -> None:
        self._db = db

    def release_leases(self) -> None:
        """Give back the leases of the process that had the file before (worker thread):
        one process at a time owns it, so a lease it finds at start is a dead one's,
        and what that process was posting is due at once instead of when the lease
        would have run out."""
        with self._db.transaction() as db:
            db.execute(
                "UPDATE webhook_deliveries SET leased_by = NULL, lease_until = 0"
                " WHERE status = 'pending' AND leased_by IS NOT NULL"
            )

    def enqueue_in(self, db: sqlite3.Connection, event: WebhookEvent, *, now: float) -> None:
        """Write ``event``'s deliveries (`deliveries_for` the event owner's endpoints
        and the operator's), inside the caller's transaction (worker thread). A
        delivery already written (same event, same endpoint) is left as it is."""
        rows = db.execute(
            f"SELECT {_ENDPOINT} FROM webhook_endpoints WHERE owner IS ? OR owner = ?",
            (event.owner, OPERATOR),
        ).fetchall()
        deliveries = deliveries_for(event, [_endpoint(row) for row in rows], now=now)
        db.executemany(
            "INSERT OR IGNORE INTO webhook_deliveries (event_id, event_type, response_id,"
            " event_created_at, event_owner, endpoint_id, endpoint_owner, status, attempts,"
            " next_attempt_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    d.event.id,
                    d.event.type,
                    d.event.response_id,
                    d.event.created_at,
                    d.event.owner,
                    d.endpoint_id,
                    d.endpoint_owner,
                    d.status,
                    d.attempts,
                    d.next_attempt_at,
                    d.updated_at,
                )
                for d in deliveries
            ],
        )

    async def put_endpoint(self, endpoint: StoredEndpoint) -> None:
        text = encoded(endpoint.endpoint)

        def work() -> None:
            with self._db.transaction() as db:
                # Another owner's endpoint of the same id (ids are random) is replaced.
                stale = db.execute(
                    "DELETE FROM webhook_endpoints WHERE id = ? AND owner IS NOT ? RETURNING id",
                    (endpoint.id, endpoint.owner),
                ).fetchall()
                if stale:
                    _drop_pending(db, endpoint.id)
                old = db.execute(
                    "SELECT 1 FROM webhook_endpoints WHERE id = ?", (endpoint.id,)
                ).fetchone()
                if old is None:
                    # The operator's endpoints count towards no limit.
                    (count,) = db.execute(
                        "SELECT count(*) FROM webhook_endpoints WHERE owner IS ? AND owner != ?",
                        (endpoint.owner, OPERATOR),
                    ).fetchone()
                    if count >= MAX_ENDPOINTS:
                        # Raised inside the transaction: rolled back, nothing written.
                        raise EndpointsFull(endpoint.owner)
                db.execute(
                    "INSERT INTO webhook_endpoints (id, owner, created_at, endpoint, secret,"
                    " previous_secret, previous_until) VALUES (?, ?, ?, ?, ?, ?, ?)"
                    " ON CONFLICT (id) DO UPDATE SET created_at = excluded.created_at,"
                    " endpoint = excluded.endpoint, secret = excluded.secret,"
                    " previous_secret = excluded.previous_secret,"
                    " previous_until = excluded.previous_until",
                    (
                        endpoint.id,
                        endpoint.owner,
                        endpoint.created_at,
                        text,
                        endpoint.secret,
                        endpoint.previous_secret,
                        endpoint.previous_until,
                    ),
                )

        await self._db.run(work)

    async def get_endpoint(self, endpoint_id: str, *, owner: str | None) -> StoredEndpoint | None:
        def work() -> StoredEndpoint | None:
            row = self._db.connection.execute(
                f"SELECT {_ENDPOINT} FROM webhook_endpoints WHERE id = ? AND owner IS ?",
                (endpoint_id, owner),
            ).fetchone()
            return None if row is None else _endpoint(row)

        return await self._db.run(work)

    async def list_endpoints(self, *, owner: str | None) -> list[StoredEndpoint]:
        def work() -> list[StoredEndpoint]:
            rows = self._db.connection.execute(
                f"SELECT {_ENDPOINT} FROM webhook_endpoints WHERE owner IS ?"
                " ORDER BY created_at DESC, id DESC",
                (owner,),
            ).fetchall()
            return [_endpoint(row) for row in rows]

        return await self._db.run(work)

    async def delete_endpoint(self, endpoint_id: str, *, owner: str | None) -> bool:
        def work() -> bool:
            with self._db.transaction() as db:
                cursor = db.execute(
                    "DELETE FROM webhook_endpoints WHERE id = ? AND owner IS ?",
                    (endpoint_id, owner),
                )
                if cursor.rowcount == 0:
                    return False
                _drop_pending(db, endpoint_id)
            return True

        return await self._db.run(work)

    async def claim(
        self,
        replica: str,
        *,
        now: float,
        lease_s: float,
        limit: int,
        per_endpoint: int | None = None,
        in_flight: Mapping[str, int] | None = None,
    ) -> list[Delivery]:
        def work() -> list[Delivery]:
            with self._db.transaction() as db:
                due = db.execute(
                    "SELECT rowid, endpoint_id FROM webhook_deliveries WHERE status = 'pending'"
                    " AND next_attempt_at <= ? AND lease_until <= ?"
                    " ORDER BY next_attempt_at LIMIT ?",  # the index's order: no sort
                    (now, now, CLAIM_SCAN),
                ).fetchall()
                taken = Counter(in_flight or {})
                chosen: list[tuple[int]] = []
                for rowid, endpoint_id in due:
                    if len(chosen) >= limit:
                        break
                    if per_endpoint is not None and taken[endpoint_id] >= per_endpoint:
                        continue  # at its share: the next due ones go first
                    taken[endpoint_id] += 1
                    chosen.append((rowid,))
                rows = [
                    db.execute(
                        "UPDATE webhook_deliveries SET attempts = attempts + 1, leased_by = ?,"
                        f" lease_until = ? WHERE rowid = ? RETURNING {_DELIVERY}",
                        (replica, now + lease_s, rowid),
                    ).fetchone()
                    for (rowid,) in chosen
                ]
            return [_delivery(row) for row in rows]

        return await self._db.run(work)

    async def settle(self, delivery: Delivery, *, replica: str) -> bool:
        def work() -> bool:
            with self._db.transaction() as db:
                cursor = db.execute(
                    "UPDATE webhook_deliveries SET status = ?, attempts = ?, next_attempt_at = ?,"
                    " updated_at = ?, last_error = ?, status_code = ?, leased_by = NULL,"
                    " lease_until = 0 WHERE event_id = ? AND endpoint_id = ?"
                    " AND status = 'pending' AND leased_by = ?",
                    (
                        delivery.status,
                        delivery.attempts,
                        delivery.next_attempt_at,
                        delivery.updated_at,
                        delivery.last_error,
                        delivery.status_code,
                        delivery.event.id,
                        delivery.endpoint_id,
                        replica,
                    ),
                )
                if cursor.rowcount == 0:
                    return False
                if delivery.status != "pending":
                    _bound_settled(db)
            return True

        return await self._db.run(work)

    async def next_due(self) -> float | None:
        def work() -> float | None:
            # min(max(next_attempt_at, lease_until)) over the pending ones, as two
            # minimums the partial indexes answer without a scan of the outbox.
            connection = self._db.connection
            (waiting,) = connection.execute(
                "SELECT min(next_attempt_at) FROM webhook_deliveries"
                " WHERE status = 'pending' AND lease_until <= next_attempt_at"
            ).fetchone()
            (leased,) = connection.execute(
                "SELECT min(lease_until) FROM webhook_deliveries"
                " WHERE status = 'pending' AND lease_until > next_attempt_at"
            ).fetchone()
            dues = [float(due) for due in (waiting, leased) if due is not None]
            return min(dues) if dues else None

        return await self._db.run(work)

    async def deliveries(self, *, limit: int) -> list[Delivery]:
        def work() -> list[Delivery]:
            rows = self._db.connection.execute(
                f"SELECT {_DELIVERY} FROM webhook_deliveries"
                " ORDER BY updated_at DESC, rowid DESC LIMIT ?",
                (max(0, limit),),
            ).fetchall()
            return [_delivery(row) for row in rows]

        return await self._db.run(work)

    async def expire(self, *, now: float, ttl_s: float) -> int:
        def work() -> int:
            with self._db.transaction() as db:
                cursor = db.execute(
                    "DELETE FROM webhook_deliveries WHERE status != 'pending'"
                    " AND updated_at + ? <= ?",
                    (ttl_s, now),
                )
                return cursor.rowcount + _bound_settled(db)

        return await self._db.run(work)


def _drop_pending(db: sqlite3.Connection, endpoint_id: str) -> None:
    """Delete an endpoint's pending deliveries (its settled ones stay, for the record)."""
    db.execute(
        "DELETE FROM webhook_deliveries WHERE endpoint_id = ? AND status = 'pending'",
        (endpoint_id,),
    )


def _bound_settled(db: sqlite3.Connection) -> int:
    """Delete the oldest settled deliveries beyond `MAX_SETTLED`; returns how many."""
    cursor = db.execute(
        "DELETE FROM webhook_deliveries WHERE rowid IN (SELECT rowid FROM webhook_deliveries"
        " WHERE status != 'pending' ORDER BY updated_at DESC, rowid DESC LIMIT -1 OFFSET ?)",
        (MAX_SETTLED,),
    )
    return cursor.rowcount
