"""The SQLite store's file: the one-process lock, the connection and its pragmas, and
a watch on the file's identity.

`open_database` takes ``PATH-lock`` (``flock``: one process per file), connects and
sets the pragmas:

- ``locking_mode=EXCLUSIVE`` before ``journal_mode=WAL``: SQLite then keeps the WAL
  index in this process's heap and never creates or maps ``PATH-shm``. A mapped file
  that a fault takes away (a read-only remount, a full disk, a truncation) is a SIGBUS
  on the next access: the process dies with nothing logged. The lock on the database
  file is held until close, so no other process (the ``sqlite3`` shell, a backup) can
  read the file while the server runs; the flock already keeps other servers out.
- ``mmap_size=0``: the database file is read and written with system calls, never
  mapped, for the same reason.
- ``synchronous=NORMAL``: in WAL mode a power cut may lose the last commits, never
  corrupts.

`Database` remembers the file's identity (device and inode) and compares it with
what the path names: before every write transaction (in the worker thread: one
``stat``) and every `WATCH_INTERVAL_S` in `Database.watch` (so an idle server
notices too). A file deleted or replaced under the server (the handle would go on
writing into a file nobody opens again) makes `Database.fault` say so: one ERROR
line names the file, writes raise `StoreError` (503 ``store_unavailable``),
``/health`` answers 503, and the WAL is checkpointed into the file the handle holds
so that no WAL of ours is left beside another file. Reads go on answering from the
open handle (what the file held when it went away). A file put back (the same
inode at the path again) is served again.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import NoReturn, TypeVar, final

import trio

from ..base import StoreError

logger = logging.getLogger("trio_responses.store.sqlite")

BUSY_TIMEOUT_S = 5.0
"""How long opening waits for a lock held by another connection (the ``sqlite3``
shell): once open, this process holds the file exclusively."""

WATCH_INTERVAL_S = 1.0
"""How often `Database.watch` checks that the path still names the open file."""

T = TypeVar("T")


@final
class Database:
    """One connection, used from worker threads one operation at a time; the
    one-process lock; the file's identity."""

    def __init__(
        self, path: str, connection: sqlite3.Connection, lock: int, identity: tuple[int, int]
    ) -> None:
        self.path = path
        self._connection = connection
        self._lock = lock
        self._limiter = trio.CapacityLimiter(1)
        self.reloads: list[Callable[[], None]] = []
        """Re-read in-memory counters from the file after a rollback undid changes they
        had counted (worker thread)."""
        self._identity = identity
        """The open file's (device, inode)."""
        self._fault: str | None = None
        self._checked = threading.Lock()

    @property
    def fault(self) -> str | None:
        """Why writes are refused (the file was deleted or replaced), or None."""
        return self._fault

    async def run(self, work: Callable[[], T]) -> T:
        """Run ``work`` in the worker thread; sqlite3 errors become `StoreError`.

        Not cancellable once the thread started (operations are short); a
        cancellation while waiting for the limiter propagates.
        """
        try:
            return await trio.to_thread.run_sync(work, limiter=self._limiter)
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite store {self.path}: {exc}") from exc

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (worker thread only): committed, or rolled back on error.

        Raises:
            StoreError: the file was deleted or replaced (`fault`); nothing is written.
        """
        fault, new = self._check()
        if new:
            self._checkpoint()
        if fault is not None:
            raise StoreError(fault)
        connection = self._connection
        # IMMEDIATE: take the write lock up front rather than upgrading midway.
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
            connection.commit()
        except BaseException:
            # Also when COMMIT failed: a transaction left open would fail every later BEGIN.
            if connection.in_transaction:
                with suppress(sqlite3.Error):
                    connection.rollback()
                    for reload in self.reloads:
                        reload()
            raise

    @property
    def connection(self) -> sqlite3.Connection:
        """For single-statement reads (worker thread only)."""
        return self._connection

    def _check(self) -> tuple[str | None, bool]:
        """Compare the path with the open file (any thread): the fault, and whether it
        is new. Logs each change."""
        refused = "writes are refused until it is put back or the server restarts"
        try:
            status = os.stat(self.path)
        except FileNotFoundError:
            fault: str | None = f"SQLite store {self.path} was deleted while in use; {refused}"
        except OSError as exc:
            fault = f"SQLite store {self.path} cannot be checked ({exc.strerror}); {refused}"
        else:
            if (status.st_dev, status.st_ino) == self._identity:
                fault = None
            else:
                fault = f"SQLite store {self.path} was replaced by another file; {refused}"
        with self._checked:
            before, self._fault = self._fault, fault
        if fault != before:
            if fault is not None:
                logger.error("%s", fault)
            else:
                logger.warning("SQLite store %s is back; writes resume", self.path)
        return fault, fault is not None and before is None

    def _checkpoint(self) -> None:
        """Move the WAL into the file the handle holds and empty it (worker thread): no
        WAL of ours stays beside whatever the path names now."""
        try:
            self._connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            logger.warning("SQLite store %s: checkpoint after the fault: %s", self.path, exc)

    async def watch(self) -> NoReturn:
        """Check the file's identity every `WATCH_INTERVAL_S` (see `fault`).

        This function never returns unless cancelled.
        """
        while True:
            await trio.sleep(WATCH_INTERVAL_S)
            # Off the loop (a stat may hang on a network file system), not behind the
            # connection's limiter (a long write must not delay it).
            _, new = await trio.to_thread.run_sync(self._check)
            if new:
                await trio.to_thread.run_sync(self._checkpoint, limiter=self._limiter)

    async def close(self) -> None:
        """Close the connection (the lock stays: see `release`)."""
        await self.run(self._connection.close)

    def release(self) -> None:
        """Release the one-process lock (after `close`, or when it timed out)."""
        os.close(self._lock)


def open_database(path: str, prepare: Callable[[sqlite3.Connection], None]) -> Database:
    """Take the lock, open the file, set the pragmas, then ``prepare`` it (the schema;
    worker thread).

    Raises:
        StoreError: another process holds the file, or it cannot be opened.
    """
    lock_path = path + "-lock"
    try:
        lock = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise StoreError(f"cannot open SQLite store {path}: {lock_path}: {exc.strerror}") from exc
    try:
        try:
            # flock, not fcntl locks: held per open file, so a second open in this same
            # process is refused too; released by the kernel when a process dies.
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise StoreError(
                    f"SQLite store {path} is in use by another trio-responses process "
                    f"(it holds {lock_path}); one process per file"
                ) from exc
            raise StoreError(f"cannot lock SQLite store {path}: {exc.strerror}") from exc
        try:
            connection = sqlite3.connect(
                path,
                timeout=BUSY_TIMEOUT_S,
                isolation_level=None,  # transactions are explicit (Database.transaction)
                check_same_thread=False,  # one worker thread at a time, by the limiter
            )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {path}: {exc}") from exc
        try:
            _set_pragmas(connection, path)
            prepare(connection)
            try:
                status = os.stat(path)
            except OSError as exc:
                raise StoreError(f"cannot open SQLite store {path}: {exc.strerror}") from exc
            return Database(path, connection, lock, (status.st_dev, status.st_ino))
        except BaseException:
            connection.close()
            raise
    except BaseException:
        os.close(lock)
        raise


def _set_pragmas(connection: sqlite3.Connection, path: str) -> None:
    shm = path + "-shm"
    # One left by an older version, or anything else there, is never opened: only one
    # made now would say that the pragmas did not take.
    stale = os.path.lexists(shm)
    try:
        # Before anything reads the file: then no shared-memory WAL index is ever made.
        connection.execute("PRAGMA locking_mode=EXCLUSIVE").fetchall()
        mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode != "wal":
            raise StoreError(f"SQLite store {path}: cannot use WAL mode (got {mode!r})")
        connection.execute("PRAGMA mmap_size=0").fetchall()
        connection.execute("PRAGMA synchronous=NORMAL")
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"cannot open SQLite store {path}: {exc} (not a trio-responses database?)"
        ) from exc
    if not stale and os.path.lexists(shm):
        raise StoreError(f"SQLite store {path}: SQLite made a shared-memory WAL index ({shm})")
