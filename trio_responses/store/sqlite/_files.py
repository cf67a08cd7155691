"""Files, containers and their bytes in SQLite (the ``files`` and ``containers`` tables).

The bytes are a BLOB column of the same database file, so they share its
durability and its one-process lock. Each method is one transaction on the
connection's worker thread: a quota check and the write it allows are atomic
(one connection, one operation at a time).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any, final

from ...protocol.codec import decode_json
from ..base import encoded
from ..files import FileQuota, QuotaExceeded, StoredContainer, StoredFile
from ._file import Database

__all__ = ["SqliteFiles"]


def _container(text: str, owner: str | None, status: str) -> StoredContainer:
    container: dict[str, Any] = decode_json(text)
    return StoredContainer({**container, "status": status}, owner)


@final
class SqliteFiles:
    """Implements `FileStore` in the ``files`` and ``containers`` tables."""

    def __init__(self, db: Database) -> None:
        self._db = db

    async def put_file(self, file: StoredFile, content: bytes, *, quota: FileQuota) -> None:
        text = encoded(file.file)
        data = bytes(content)

        def work() -> None:
            with self._db.transaction() as db:
                if file.container_id is not None:
                    row = db.execute(
                        "SELECT status FROM containers WHERE id = ? AND owner IS ?",
                        (file.container_id, file.owner),
                    ).fetchone()
                    if row is None or row[0] == "expired":
                        return
                count, size = db.execute(
                    "SELECT count(*), coalesce(sum(bytes), 0) FROM files WHERE owner IS ?",
                    (file.owner,),
                ).fetchone()
                old = db.execute(
                    "SELECT bytes FROM files WHERE id = ? AND owner IS ?", (file.id, file.owner)
                ).fetchone()
                new_count = count + (0 if old is not None else 1)
                new_size = size + len(data) - (old[0] if old is not None else 0)
                if new_count > quota.max_files and new_count > count:
                    raise QuotaExceeded("files", quota.max_files)
                if new_size > quota.max_bytes and new_size > size:
                    raise QuotaExceeded("bytes", quota.max_bytes)
                db.execute(
                    "INSERT OR REPLACE INTO files"
                    " (id, owner, container_id, created_at, file, bytes, content)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        file.id,
                        file.owner,
                        file.container_id,
                        float(file.file["created_at"]),
                        text,
                        len(data),
                        data,
                    ),
                )

        await self._db.run(work)

    async def get_file(self, file_id: str, *, owner: str | None) -> StoredFile | None:
        def work() -> StoredFile | None:
            row = self._db.connection.execute(
                "SELECT file FROM files WHERE id = ? AND owner IS ?", (file_id, owner)
            ).fetchone()
            return None if row is None else StoredFile(decode_json(row[0]), owner)

        return await self._db.run(work)

    async def read_file(self, file_id: str, *, owner: str | None) -> bytes | None:
        def work() -> bytes | None:
            row = self._db.connection.execute(
                "SELECT content FROM files WHERE id = ? AND owner IS ?", (file_id, owner)
            ).fetchone()
            return None if row is None else bytes(row[0])

        return await self._db.run(work)

    async def delete_file(self, file_id: str, *, owner: str | None) -> bool:
        def work() -> bool:
            with self._db.transaction() as db:
                cursor = db.execute(
                    "DELETE FROM files WHERE id = ? AND owner IS ?", (file_id, owner)
                )
                return cursor.rowcount > 0

        return await self._db.run(work)

    async def list_files(
        self, *, owner: str | None, container_id: str | None
    ) -> Sequence[StoredFile]:
        def work() -> list[StoredFile]:
            rows = self._db.connection.execute(
                "SELECT file FROM files WHERE owner IS ? AND container_id IS ?"
                " ORDER BY created_at, id",
                (owner, container_id),
            ).fetchall()
            return [StoredFile(decode_json(row[0]), owner) for row in rows]

        return await self._db.run(work)

    async def put_container(self, container: StoredContainer, *, quota: FileQuota) -> None:
        text = encoded(container.container)

        def work() -> None:
            with self._db.transaction() as db:
                # Another owner's container of the same id (ids are random) is replaced.
                db.execute(
                    "DELETE FROM containers WHERE id = ? AND owner IS NOT ?",
                    (container.id, container.owner),
                )
                old = db.execute(
                    "SELECT status FROM containers WHERE id = ?", (container.id,)
                ).fetchone()
                was_live = old is not None and old[0] != "expired"
                if container.status != "expired" and not was_live:
                    (live,) = db.execute(
                        "SELECT count(*) FROM containers WHERE owner IS ? AND status != 'expired'",
                        (container.owner,),
                    ).fetchone()
                    if live + 1 > quota.max_containers:
                        raise QuotaExceeded("containers", quota.max_containers)
                db.execute(
                    "INSERT INTO containers (id, owner, status, created_at, expires_at, container)"
                    " VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (id) DO UPDATE SET"
                    " status = excluded.status, created_at = excluded.created_at,"
                    " expires_at = excluded.expires_at, container = excluded.container",
                    (
                        container.id,
                        container.owner,
                        container.status,
                        float(container.container["created_at"]),
                        container.expires_at,
                        text,
                    ),
                )

        await self._db.run(work)

    async def get_container(
        self, container_id: str, *, owner: str | None
    ) -> StoredContainer | None:
        def work() -> StoredContainer | None:
            row = self._db.connection.execute(
                "SELECT container, status FROM containers WHERE id = ? AND owner IS ?",
                (container_id, owner),
            ).fetchone()
            return None if row is None else _container(row[0], owner, row[1])

        return await self._db.run(work)

    async def list_containers(self, *, owner: str | None) -> Sequence[StoredContainer]:
        def work() -> list[StoredContainer]:
            rows = self._db.connection.execute(
                "SELECT container, status FROM containers WHERE owner IS ? ORDER BY created_at, id",
                (owner,),
            ).fetchall()
            return [_container(text, owner, status) for text, status in rows]

        return await self._db.run(work)

    async def delete_container(self, container_id: str, *, owner: str | None) -> bool:
        def work() -> bool:
            with self._db.transaction() as db:
                # The trigger containers_drop_files deletes its files.
                cursor = db.execute(
                    "DELETE FROM containers WHERE id = ? AND owner IS ?", (container_id, owner)
                )
                return cursor.rowcount > 0

        return await self._db.run(work)

    async def expire_containers(self, now: float) -> Sequence[StoredContainer]:
        def work() -> list[StoredContainer]:
            with self._db.transaction() as db:
                rows = db.execute(
                    "UPDATE containers SET status = 'expired'"
                    " WHERE status = 'running' AND expires_at < ?"
                    " RETURNING id, owner, container",
                    (now,),
                ).fetchall()
                _drop_files(db, [row[0] for row in rows])
            expired = [_container(text, owner, "expired") for _, owner, text in rows]
            return sorted(expired, key=lambda c: (c.container["created_at"], c.id))

        return await self._db.run(work)


def _drop_files(db: sqlite3.Connection, container_ids: list[str]) -> None:
    db.executemany("DELETE FROM files WHERE container_id = ?", [(i,) for i in container_ids])
