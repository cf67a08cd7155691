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
- `SqliteFiles` (``_files.py``): files, containers and their bytes (a BLOB
  column of this same file), with the per-owner quotas (`FileQuota`).
- `SqliteWebhooks` (``_webhooks.py``): webhook endpoints and the outbox of
  deliveries, which `SqliteStore` writes in the transaction of a background
  response's final record.
- `open_sqlite_state`: opens the file and creates or migrates the schema,
  watches that the path still names that file, and closes it on exit. Control
  is `LocalControl`: one process owns the file, so every job runs here or nowhere.

The file itself (the one-process lock, WAL without a memory-mapped index, the
watch on its identity) is `_file`'s. Every statement runs in a worker
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
    files(id PK, owner, container_id, created_at, file JSON, bytes, content BLOB)  (v4)
    containers(id PK, owner, status, created_at, expires_at, container JSON)  (v4;
               deleting one deletes its files, by trigger)
    webhook_endpoints(id PK, owner, created_at, endpoint JSON, secret sealed,
                      previous_secret, previous_until)  (v5)
    webhook_deliveries(event_id, endpoint_id, the event's fields, status, attempts,
                       next_attempt_at, updated_at, last_error, status_code,
                       leased_by, lease_until, PK(event_id, endpoint_id))  (v5)

A batch is the frames of one `SqliteEventLogs.append` call, concatenated: each
SSE frame ends with ``\\n\\n`` and holds no other, so the batch splits back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import trio

from ..._config import Config
from ..base import State, StoreError, StoreLimits
from ..memory import LocalControl
from ._file import open_database
from ._files import SqliteFiles
from ._logs import SqliteEventLogs
from ._records import SqliteConversations, SqliteStore
from ._schema import SCHEMA_VERSION, prepare_schema
from ._webhooks import SqliteWebhooks

__all__ = [
    "SCHEMA_VERSION",
    "SqliteConversations",
    "SqliteEventLogs",
    "SqliteFiles",
    "SqliteStore",
    "SqliteWebhooks",
    "open_sqlite_state",
]

logger = logging.getLogger("trio_responses.store.sqlite")


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
        open_database, path, lambda connection: prepare_schema(connection, path)
    )
    control = LocalControl()
    webhooks = SqliteWebhooks(db)
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
        webhooks=webhooks,
    )
    try:

        def load() -> None:
            store.load()
            logs.load()
            logs.seal_orphans()
            webhooks.release_leases()

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
                    files=SqliteFiles(db),
                    webhooks=webhooks,
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
