"""The SQLite file's schema, its version and the migrations of older files."""

from __future__ import annotations

import logging
import sqlite3

from ..base import (
    StoreError,
)

logger = logging.getLogger("trio_responses.store.sqlite")

SCHEMA_VERSION = 5

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
    + """
-- Files (v4): /v1/files files (container_id NULL) and container files, with their bytes.
CREATE TABLE IF NOT EXISTS files (
    id           TEXT PRIMARY KEY,
    owner        TEXT,
    container_id TEXT,
    created_at   REAL NOT NULL,
    file         TEXT NOT NULL,
    bytes        INTEGER NOT NULL,
    content      BLOB NOT NULL
);
CREATE INDEX IF NOT EXISTS files_owner ON files (owner, container_id, created_at, id);
CREATE INDEX IF NOT EXISTS files_container ON files (container_id)
    WHERE container_id IS NOT NULL;

CREATE TABLE IF NOT EXISTS containers (
    id         TEXT PRIMARY KEY,
    owner      TEXT,
    status     TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    container  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS containers_owner ON containers (owner, created_at, id);
CREATE INDEX IF NOT EXISTS containers_running ON containers (expires_at)
    WHERE status = 'running';
-- Updates of a container (an upsert) fire no delete trigger: its files stay.
CREATE TRIGGER IF NOT EXISTS containers_drop_files AFTER DELETE ON containers BEGIN
    DELETE FROM files WHERE container_id = OLD.id;
END;
"""
    + """
-- Webhooks (v5): endpoints (ids unique in the file) and the outbox of their deliveries.
CREATE TABLE IF NOT EXISTS webhook_endpoints (
    id              TEXT PRIMARY KEY,
    owner           TEXT,
    created_at      INTEGER NOT NULL,
    endpoint        TEXT NOT NULL,
    secret          TEXT NOT NULL,
    previous_secret TEXT,
    previous_until  REAL
);
CREATE INDEX IF NOT EXISTS webhook_endpoints_owner
    ON webhook_endpoints (owner, created_at, id);

CREATE TABLE IF NOT EXISTS webhook_deliveries (
    event_id         TEXT NOT NULL,
    event_type       TEXT NOT NULL,
    response_id      TEXT NOT NULL,
    event_created_at REAL NOT NULL,
    event_owner      TEXT,
    endpoint_id      TEXT NOT NULL,
    endpoint_owner   TEXT,
    status           TEXT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  REAL NOT NULL,
    updated_at       REAL NOT NULL,
    last_error       TEXT,
    status_code      INTEGER,
    leased_by        TEXT,
    lease_until      REAL NOT NULL DEFAULT 0,
    PRIMARY KEY (event_id, endpoint_id)
);
CREATE INDEX IF NOT EXISTS webhook_deliveries_due
    ON webhook_deliveries (next_attempt_at, lease_until, endpoint_id) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS webhook_deliveries_next
    ON webhook_deliveries (next_attempt_at)
    WHERE status = 'pending' AND lease_until <= next_attempt_at;
CREATE INDEX IF NOT EXISTS webhook_deliveries_leased
    ON webhook_deliveries (lease_until)
    WHERE status = 'pending' AND lease_until > next_attempt_at;
CREATE INDEX IF NOT EXISTS webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id);
CREATE INDEX IF NOT EXISTS webhook_deliveries_updated ON webhook_deliveries (updated_at);
CREATE INDEX IF NOT EXISTS webhook_deliveries_settled
    ON webhook_deliveries (updated_at) WHERE status != 'pending';
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
    3: "",  # the files and containers tables: `_SCHEMA` creates them (IF NOT EXISTS)
    4: "",  # the webhook tables: `_SCHEMA` creates them (IF NOT EXISTS)
}
"""The statements that bring a file of schema version N to N + 1."""


def prepare_schema(connection: sqlite3.Connection, path: str) -> None:
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
