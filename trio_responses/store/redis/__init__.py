"""``redis://HOST:PORT/N``, ``rediss://…``, ``unix:///PATH?db=N``: state shared by replicas.

This module owns the Redis backend of the state layer (SPEC §12):

- `RedisStore`: response records, one JSON string per response, plus the
  ``running`` hash that says which replica runs which unfinished response;
- `RedisEventLogs`: one Redis Stream per background response, written while
  the job runs, so any replica can replay it or follow it live;
- `RedisFiles` (``_files.py``): files, containers and their bytes, with the
  per-owner quotas (`FileQuota`) kept in a hash that the writing scripts check
  and change atomically;
- `RedisWebhooks` (``_webhooks.py``): webhook endpoints and the outbox of their
  deliveries, which the scripts that write a background response's final state
  (`RedisStore.put`, a recovery's claim) fill in the same step;
- `RedisControl`: this replica's lease (its heartbeat) and its control stream,
  on which other replicas ask it to cancel a response.

All share one `_Redis`: a coredis client for ordinary commands and a
second one for blocking reads (``XREAD BLOCK``), so that readers waiting for
events never hold the connections writers need. Needs Redis ≥ 6.2 (``XADD …
MINID``); one server or a primary (not Cluster: scripts touch several keys).

Key layout (``PREFIX`` is ``trio-responses:``)::

    PREFIX response:{id}    string  JSON {response, input_items, owner, replica, updated_at};
                                    no TTL while running, PX store_ttl_s once finished
    PREFIX running          hash    response id → replica running it ("" when unknown)
    PREFIX finished[:OWNER] zset    id of each finished record, scored by its finish time:
                                    one index for the whole store, or, with API keys,
                                    one per owner (its tenant: see `StoreLimits`)
    PREFIX stored:bytes     hash    finished record id → its bytes (`record_bytes`)
    PREFIX stored:total[:OWNER] string  the sum of that index's bytes
    PREFIX stored:owners    set     ":OWNER" of each per-owner index (for `expire`)
    PREFIX lease:{replica}  string  "host:pid", PX job_lease_s, refreshed every job_lease_s/3
    PREFIX control:{replica} stream cancel messages for that replica: {id: response id}
    PREFIX log:{id}         stream  an entry per `append` batch (per _ENTRY_BYTES of it):
                                    id 0-{last + 1}, fields f (first sequence number),
                                    d (the frames, concatenated)
    PREFIX logmeta:{id}     hash    owner (JSON), next (next sequence number), bytes (of
                                    the entries kept), done (the terminal event's number,
                                    once written)
    PREFIX retained         zset    id of each finished log, scored by its finish time
    PREFIX retained:bytes   hash    finished log id → its bytes (logmeta's, when it finished)
    PREFIX retained:total   string  the sum of retained:bytes
    PREFIX item:{owner}:{item id}  zset "r:{response id}", "c:{conversation id}": the
                                    owner's finished records and conversations holding
                                    the item, scored by when they took it (a hint: readers
                                    check the newest few, forgetting those that no longer
                                    hold it); the newest lua.ITEM_SOURCES kept; PX store_ttl_s
    PREFIX conversation:{id}        hash owner ("" without), object (JSON), bytes,
                                    holder, lock_until (ms): PX store_ttl_s after last use
    PREFIX conversation:{id}:ids    list its item ids in order (same TTL)
    PREFIX conversation:{id}:items  hash item id → item JSON (same TTL)
    PREFIX conversations[:OWNER]    zset conversation ids by last use: one per tenant
    PREFIX conversations:bytes      hash conversation id → its bytes
    PREFIX conversations:total[:OWNER] string the sum of that index's bytes
    PREFIX file:{id}                hash owner ("" without), container ("" for a /v1/files
                                    file), size, object (JSON)
    PREFIX file:{id}:bytes          string the file's bytes
    PREFIX files[:OWNER]            zset the owner's /v1/files file ids by created_at
    PREFIX container:{id}           hash owner, status, object (JSON; its status is the
                                    hash's)
    PREFIX container:{id}:files     zset its files' ids by created_at
    PREFIX containers[:OWNER]       zset the owner's container ids by created_at
    PREFIX expiring-containers      zset running container ids by expiry time (s)
    PREFIX file-quota[:OWNER]       hash files, bytes (both kinds together), containers
                                    (not expired): what the owner holds
    PREFIX webhook-endpoint:{owner}:{id}  hash types (" t1 t2 ": its event types),
                                    object (JSON: the endpoint, its sealed secrets);
                                    owner "" without one, "operator" for the operator's
    PREFIX webhook-endpoint:{owner}:{id}:pending  set its pending deliveries' members
    PREFIX webhook-endpoints:{owner} zset the owner's endpoint ids by created_at
    PREFIX webhook-delivery:{event id}:{endpoint id}  hash event (JSON), endpoint,
                                    endpoint_owner, status, attempts, next_attempt_at,
                                    updated_at, last_error, status_code, leased_by,
                                    lease_until (the last four only when set)
    PREFIX webhook-due              zset pending deliveries ("{event id}:{endpoint id}")
                                    by when due: the later of next_attempt_at and
                                    lease_until (s)
    PREFIX webhook-deliveries       zset every delivery by updated_at (s)
    PREFIX webhook-settled          zset delivered and failed ones by updated_at: those
                                    `expire` drops, at most `MAX_SETTLED` kept

Finish times are the server's clock (``TIME``, microseconds), so every replica
orders them alike.

Bounds: Redis TTLs expire finished records (``store_ttl_s``) and finished logs
(``stream_retention_s``); each log is trimmed to about ``replay_events`` events.
The count and byte limits hold as well, the oldest finished first, as in the
other backends: the script that finishes a record (`RedisStore.put`, a
recovery's claim) evicts the oldest finished records of its index beyond the
index's share of ``max_stored_responses`` and ``max_store_bytes``, and
the scripts that finish a log (`RedisEventLogs.finish`, `terminate`, a claim)
evict the oldest finished logs beyond ``max_retained_streams`` or
``retained_stream_bytes`` (the newest stays, however large). Running records
and logs are never evicted. A member of ``finished`` or ``retained`` whose key
its TTL removed is dropped when met: by score (older than the TTL) in those
scripts and in `expire`, or when a trim pops it (deleting a missing key is
harmless).

Entry ids encode sequence numbers, so a reader at cursor ``c`` asks for ids
after ``0-{c + 1}``; its script leaves out the frames ``≤ c`` of the first entry
and hands out about ``_READ_BYTES`` of frames (at least one), cutting an entry
larger than that: resuming costs the same early or late in a long log.

Cancellation: coredis answers requests in order on a multiplexed connection,
so an ordinary command whose caller is cancelled leaves its reply to be read
and dropped by coredis, never by a later command. A cancelled *blocking*
command (``XREAD``, with or without ``BLOCK``) makes coredis close that
connection instead (its reply can reach nothing). What coredis 6.9 gets wrong
is the pool's bookkeeping around those cancellations: it loses a slot per
cancelled blocking read and per cancellation during a connection's set-up, so
a pool would end up with no connection to hand out. Our pool
(`trio_responses._adapters.coredis.ConnectionPool`) fixes both.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import trio

from ..._config import Config, redacted_url
from ..base import State, StoreError
from ._client import _BLOCK_MS, _CONNECT_TIMEOUT_S, PREFIX, _client, _io, _Redis
from ._files import RedisFiles
from ._logs import RedisControl, RedisEventLogs
from ._records import RedisConversations, RedisStore
from ._webhooks import RedisWebhooks

__all__ = [
    "PREFIX",
    "RedisControl",
    "RedisConversations",
    "RedisEventLogs",
    "RedisFiles",
    "RedisStore",
    "RedisWebhooks",
    "open_redis_state",
]

logger = logging.getLogger("trio_responses.store.redis")

_BLOCKING_CONNECTIONS = 4_096
"""Blocking reads in flight at once (one per live reader, one per control loop)."""

_COMMAND_TIMEOUT_S = 10.0
"""A reply that takes longer means the server is in trouble: `StoreError`."""


@asynccontextmanager
async def open_redis_state(url: str, config: Config) -> AsyncIterator[State]:
    """The Redis backend at ``url``; checks the server answers, closes the clients on exit.

    Raises:
        StoreError: the server cannot be reached (or refuses the connection).
    """
    commands = _client(url, stream_timeout_s=_COMMAND_TIMEOUT_S, max_connections=None)
    blocking = _client(
        url,
        stream_timeout_s=_BLOCK_MS / 1000 + _COMMAND_TIMEOUT_S,
        max_connections=_BLOCKING_CONNECTIONS,
    )
    # The clients' pools are task groups: they must be exited inside the scope
    # that was current when they were entered. `closing` is that scope, made
    # shielded and given the cleanup budget when it is time to close.
    closing = trio.CancelScope()
    with closing:
        stack = AsyncExitStack()
        try:
            await stack.enter_async_context(commands)
            await stack.enter_async_context(blocking)
            redis = _Redis(commands, blocking, config)
            with trio.move_on_after(max(config.cleanup_timeout_s, _CONNECT_TIMEOUT_S)) as ping:
                await _io(commands.ping())
                await redis.load_scripts()
            if ping.cancelled_caught:
                raise StoreError("no answer to PING in time")
        except StoreError as error:
            await _close(stack, closing, config)
            raise StoreError(f"Cannot use Redis at {redacted_url(url)}: {error.message}") from error
        except BaseException:
            await _close(stack, closing, config)
            raise
        try:
            yield State(
                kind="redis",
                store=RedisStore(redis),
                logs=RedisEventLogs(redis),
                control=RedisControl(redis),
                conversations=RedisConversations(redis),
                files=RedisFiles(redis),
                webhooks=RedisWebhooks(redis),
            )
        finally:
            # Closed with no exception passed in: the pools' task groups would wrap
            # the body's exception in an ExceptionGroup; this way it leaves as it came.
            await _close(stack, closing, config)
    if closing.cancelled_caught:
        logger.warning("closing the Redis clients took longer than %s s", config.cleanup_timeout_s)


async def _close(stack: AsyncExitStack, closing: trio.CancelScope, config: Config) -> None:
    closing.shield = True
    closing.deadline = trio.current_time() + config.cleanup_timeout_s
    await stack.aclose()
