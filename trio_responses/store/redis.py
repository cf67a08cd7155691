"""``redis://HOST:PORT/N``, ``rediss://…``, ``unix:///PATH?db=N``: state shared by replicas.

This module owns the Redis backend of the state layer (SPEC §12):

- `RedisStore`: response records, one JSON string per response, plus the
  ``running`` hash that says which replica runs which unfinished response;
- `RedisEventLogs`: one Redis Stream per background response, written while
  the job runs, so any replica can replay it or follow it live;
- `RedisControl`: this replica's lease (its heartbeat) and its control stream,
  on which other replicas ask it to cancel a response.

All three share one `_Redis`: a coredis client for ordinary commands and a
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
                                    hold it); the newest _ITEM_SOURCES kept; PX store_ttl_s
    PREFIX conversation:{id}        hash owner ("" without), object (JSON), bytes,
                                    holder, lock_until (ms): PX store_ttl_s after last use
    PREFIX conversation:{id}:ids    list its item ids in order (same TTL)
    PREFIX conversation:{id}:items  hash item id → item JSON (same TTL)
    PREFIX conversations[:OWNER]    zset conversation ids by last use: one per tenant
    PREFIX conversations:bytes      hash conversation id → its bytes
    PREFIX conversations:total[:OWNER] string the sum of that index's bytes

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
a pool would end up with no connection to hand out. `_Pool` fixes both.
"""

from __future__ import annotations

import json
import logging
import math
import os
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from functools import partial
from typing import Any, NoReturn, TypeVar, final

import coredis
import trio
from coredis.commands.script import Script
from coredis.exceptions import RedisError
from coredis.pool import ConnectionPool
from coredis.response.types import StreamEntry
from coredis.tokens import PureToken

from .._config import Config, redacted_url
from .._offload import estimated_size, offload
from ..background.event_log import EventLog, SubscriberLagged
from ..background.subscription import ReaderSubscription, Subscription
from ..protocol.builder import terminal_frame
from ..protocol.sse import is_terminal_frame, split_frames
from .base import (
    CancelHandler,
    ConversationFull,
    LogStatistics,
    State,
    StoredConversation,
    StoredResponse,
    StoreError,
    StoreLimits,
    encoded,
)

logger = logging.getLogger("trio_responses.store.redis")

T = TypeVar("T")

PREFIX = "trio-responses:"
_RUNNING = PREFIX + "running"
_FINISHED = PREFIX + "finished"
_STORED_BYTES = PREFIX + "stored:bytes"
_STORED_TOTAL = PREFIX + "stored:total"
_STORED_OWNERS = PREFIX + "stored:owners"
_RETAINED = PREFIX + "retained"
_CONVERSATIONS_INDEX = PREFIX + "conversations"
_CONVERSATIONS_TOTAL = PREFIX + "conversations:total"
_CONVERSATIONS_BYTES = PREFIX + "conversations:bytes"
_RETAINED_BYTES = PREFIX + "retained:bytes"
_RETAINED_TOTAL = PREFIX + "retained:total"
_RETAINED_KEYS = (_RETAINED, _RETAINED_BYTES, _RETAINED_TOTAL)
"""The keys of the finished-log index, last in every script that changes it."""

_BLOCK_MS = 1_000
"""Longest ``XREAD BLOCK``: a quiet reader returns ``[]`` this often and is asked again."""
_ENTRY_BYTES = 1 << 16
"""Most bytes of frames in one stream entry (at least one frame): a larger `append`
batch becomes several entries, so that no read fetches much more than it hands out."""
_READ_BYTES = 1 << 18
"""Most bytes of frames one read hands out (at least one frame): one SSE write's worth."""
_READ_ENTRIES = 1_024
"""Most stream entries one read fetches (it stops at `_READ_BYTES` well before, unless
the entries are tiny)."""
_COMMAND_TIMEOUT_S = 10.0
"""A reply that takes longer means the server is in trouble: `StoreError`."""
_CONNECT_TIMEOUT_S = 5.0
_BLOCKING_CONNECTIONS = 4_096
"""Blocking reads in flight at once (one per live reader, one per control loop)."""
_CONTROL_MAXLEN = 1_000
_MAX_TTL_S = 10 * 365 * 24 * 3600.0
"""TTLs longer than this (``inf`` included) are capped: PX takes a finite number."""
_RETRY_FIRST_S = 0.05
_RETRY_MAX_S = 5.0
_REBUILDS = 5
"""Attempts at a terminal frame whose log keeps moving (a writer thought dead still writes)."""


def _record_key(response_id: str) -> str:
    return f"{PREFIX}response:{response_id}"


def _conversation_key(conversation_id: str) -> str:
    return f"{PREFIX}conversation:{conversation_id}"


def _lease_key(replica: str) -> str:
    return f"{PREFIX}lease:{replica}"


def _control_key(replica: str) -> str:
    return f"{PREFIX}control:{replica}"


def _log_key(response_id: str) -> str:
    return f"{PREFIX}log:{response_id}"


def _meta_key(response_id: str) -> str:
    return f"{PREFIX}logmeta:{response_id}"


def _ms(seconds: float) -> int:
    """A PX argument: whole milliseconds, at least 1."""
    return max(1, math.ceil(min(seconds, _MAX_TTL_S) * 1000))


def _entry_id(next_sequence: int) -> str:
    """The id of the entry whose last frame is ``next_sequence - 1`` (ids must exceed 0-0)."""
    return f"0-{next_sequence}"


def _dumps(value: Any) -> str:
    """Strict JSON (no NaN); a value that cannot be stored is a `StoreError`."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise StoreError(f"Redis store: cannot encode a record as JSON: {error}") from error


async def _io(request: Awaitable[T]) -> T:
    """Await one Redis command; the one place backend failures become `StoreError`.

    ``trio.Cancelled`` is not an ``Exception`` and passes through untouched.
    """
    try:
        return await request
    except (RedisError, TimeoutError, OSError) as error:
        raise StoreError(
            f"The response store (Redis) is unavailable: {error or type(error).__name__}"
        ) from error


@final
class _Pool(ConnectionPool[Any]):
    """coredis 6.9's pool, minus two leaks of its slots (see the module docstring).

    Each slot of the pool is either idle in it or leased. coredis loses a slot
    (for good: after ``max_connections`` losses every command waits for a
    connection that never comes) when

    - a leased connection dies (a blocking command cancelled, timed out or cut
      off): `release` drops the connection and not the slot; and
    - the caller is cancelled while `get_connection` sets up a new connection
      (connect and handshake): the slot taken for it is never put back.
    """

    async def get_connection(self, **kwargs: Any) -> Any:
        # Uncancellable, so never cut off half-way; bounded by the pool's own
        # timeout (and, within it, the connect and reply timeouts). Normally it
        # takes an idle connection at once; a cancellation waits for a new
        # connection's set-up (well under a millisecond on a healthy server).
        with trio.CancelScope(shield=True):
            return await super().get_connection(**kwargs)

    def release(self, connection: Any) -> None:
        super().release(connection)
        if not connection.usable and not self._available_connections.full():
            self._available_connections.append_nowait(None)


# -- Lua scripts: each a single command, so atomic and safe to cancel ---------------
#
# The scripts that change the finished-log index (``retained``) answer
# {status, retained count, retained bytes}; `_Redis.run` keeps the two figures for
# `RedisEventLogs.statistics`. Keys evicted by a trim are named in the script from
# ARGV's prefix (one server or a primary: not Cluster).

_HELPERS = """
local function int(n)  -- a number as a command argument: whole, never in e-notation
  return string.format('%d', n)
end

local function now_us()  -- the server's clock: one order for every replica
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

local function field(fields, name)  -- a stream entry's field (fields: {k1, v1, k2, v2, ...})
  for i = 1, #fields, 2 do
    if fields[i] == name then return fields[i + 1] end
  end
  return ''
end
"""

_RECORDS = (
    _HELPERS
    + """
-- One index of finished records: x = {index, total, sizes, owners, suffix, ttl_ms,
-- max, max_bytes, prefix}, read from KEYS[k..k+3] and ARGV[a..a+4].
local function records(k, a)
  return {index = KEYS[k], total = KEYS[k + 1], sizes = KEYS[k + 2], owners = KEYS[k + 3],
          suffix = ARGV[a], ttl_ms = tonumber(ARGV[a + 1]), max = tonumber(ARGV[a + 2]),
          max_bytes = tonumber(ARGV[a + 3]), prefix = ARGV[a + 4]}
end

-- Forget the members of an index whose record its TTL removed (finished before
-- cutoff); returns how many.
local function forget_stale(index, total, sizes, cutoff)
  local stale = redis.call('ZRANGEBYSCORE', index, '-inf', cutoff)
  if #stale == 0 then return 0 end
  redis.call('ZREMRANGEBYSCORE', index, '-inf', cutoff)
  local size = 0
  for _, id in ipairs(stale) do
    size = size + tonumber(redis.call('HGET', sizes, id) or '0')
    redis.call('HDEL', sizes, id)
  end
  redis.call('DECRBY', total, int(size))
  return #stale
end

-- Take a member out of an index (the record is deleted or running again).
local function unindex(x, id)
  if redis.call('ZREM', x.index, id) == 1 then
    redis.call('DECRBY', x.total, int(tonumber(redis.call('HGET', x.sizes, id) or '0')))
    redis.call('HDEL', x.sizes, id)
  end
end

-- A record finished: index it with its size, forget members its TTL removed, and
-- evict the oldest finished records of the index beyond its count and byte share;
-- the newest stays, however large (running records are not in the index).
local function finished_record(x, id, size)
  local now = now_us()
  forget_stale(x.index, x.total, x.sizes, int(now - x.ttl_ms * 1000))
  unindex(x, id)
  redis.call('ZADD', x.index, int(now), id)
  redis.call('HSET', x.sizes, id, int(size))
  local count = redis.call('ZCARD', x.index)
  local sum = tonumber(redis.call('INCRBY', x.total, int(size)))
  while count > x.max or (count > 1 and sum > x.max_bytes) do
    local oldest = redis.call('ZPOPMIN', x.index)[1]
    sum = sum - tonumber(redis.call('HGET', x.sizes, oldest) or '0')
    count = count - 1
    redis.call('HDEL', x.sizes, oldest)
    redis.call('DEL', x.prefix .. 'response:' .. oldest)
  end
  if sum < 0 then sum = 0 end  -- only if the index was tampered with
  redis.call('SET', x.total, int(sum))
  if x.suffix ~= '' then
    redis.call('SADD', x.owners, x.suffix)
  end
end
"""
)

_LOGS = (
    _HELPERS
    + """
-- The finished-log index: b = {index, sizes, total, retention_ms, max_streams,
-- max_bytes, prefix}, read from KEYS[k..k+2] and ARGV[a..a+3].
local function bounds(k, a)
  return {index = KEYS[k], sizes = KEYS[k + 1], total = KEYS[k + 2],
          retention_ms = tonumber(ARGV[a]), max_streams = tonumber(ARGV[a + 1]),
          max_bytes = tonumber(ARGV[a + 2]), prefix = ARGV[a + 3]}
end

-- Delete a log (gone from the index already) and its size; returns the size.
local function drop_log(b, id)
  local size = tonumber(redis.call('HGET', b.sizes, id) or '0')
  redis.call('HDEL', b.sizes, id)
  redis.call('DEL', b.prefix .. 'log:' .. id, b.prefix .. 'logmeta:' .. id)
  return size
end

-- Forget the finished logs past their retention (their TTL removed them), then
-- evict the oldest beyond the count and byte limits (the newest stays, however
-- large). Returns {forgotten, retained count, retained bytes}.
local function trim_logs(b)
  local sum = tonumber(redis.call('GET', b.total) or '0')
  local cutoff = int(now_us() - b.retention_ms * 1000)
  local stale = redis.call('ZRANGEBYSCORE', b.index, '-inf', cutoff)
  if #stale > 0 then
    redis.call('ZREMRANGEBYSCORE', b.index, '-inf', cutoff)
    for _, id in ipairs(stale) do
      sum = sum - drop_log(b, id)
    end
  end
  local count = redis.call('ZCARD', b.index)
  while count > b.max_streams or (count > 1 and sum > b.max_bytes) do
    local oldest = redis.call('ZPOPMIN', b.index)
    sum = sum - drop_log(b, oldest[1])
    count = count - 1
  end
  if sum < 0 then sum = 0 end  -- only if the index was tampered with
  redis.call('SET', b.total, int(sum))
  return {#stale, count, sum}
end

-- A log finished: index it with its bytes, then keep within the bounds.
local function retain_log(b, meta, id)
  local size = tonumber(redis.call('HGET', meta, 'bytes') or '0')
  local before = tonumber(redis.call('HGET', b.sizes, id) or '0')  -- finished twice
  redis.call('ZADD', b.index, int(now_us()), id)
  redis.call('HSET', b.sizes, id, int(size))
  redis.call('INCRBY', b.total, int(size - before))
  local kept = trim_logs(b)
  return {1, kept[2], kept[3]}
end

-- Append the terminal frame to an open log and finish it.
local function end_log(b, log, meta, id, expected, frame)
  local n = tonumber(expected)
  redis.call('XADD', log, '0-' .. tostring(n + 1), 'f', expected, 'd', frame)
  redis.call('HSET', meta, 'next', tostring(n + 1), 'done', expected)
  redis.call('HINCRBY', meta, 'bytes', int(#frame))
  redis.call('PEXPIRE', log, int(b.retention_ms))
  redis.call('PEXPIRE', meta, int(b.retention_ms))
  return retain_log(b, meta, id)
end
"""
)

_PUT = (
    _RECORDS
    + """
-- KEYS: record, running, then the record's index (index, total, sizes, owners).
-- ARGV: json, id, replica, size, running ('1' or ''), then the index's bounds
-- (suffix, ttl_ms, max, max_bytes, prefix)
local x = records(3, 6)
if redis.call('ZSCORE', x.index, ARGV[2]) then
  -- A finished record is final: this is a retried write, or a replica that stalled
  -- past its lease writing over the recovery of its response.
  return 0
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[1], ARGV[1])
  redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', int(x.ttl_ms))
  redis.call('HDEL', KEYS[2], ARGV[2])
  finished_record(x, ARGV[2], tonumber(ARGV[4]))
end
return 1
"""
)

_DELETE = (
    _RECORDS
    + """
-- KEYS: record, running, then the record's index (index, total, sizes, owners).
-- ARGV: id, then the index's bounds (suffix, ttl_ms, max, max_bytes, prefix)
redis.call('HDEL', KEYS[2], ARGV[1])
unindex(records(3, 2), ARGV[1])
return redis.call('DEL', KEYS[1])
"""
)

_EXPIRE_RECORDS = (
    _RECORDS
    + """
-- KEYS: sizes, owners. ARGV: ttl_ms, prefix. Forgets, in every index, the members
-- whose record its TTL removed; returns how many. An emptied per-owner index is
-- forgotten as well.
local cutoff = int(now_us() - tonumber(ARGV[1]) * 1000)
local forgotten = 0
local suffixes = redis.call('SMEMBERS', KEYS[2])
table.insert(suffixes, '')  -- the whole store's index
for _, suffix in ipairs(suffixes) do
  local index = ARGV[2] .. 'finished' .. suffix
  local total = ARGV[2] .. 'stored:total' .. suffix
  forgotten = forgotten + forget_stale(index, total, KEYS[1], cutoff)
  if suffix ~= '' and redis.call('ZCARD', index) == 0 then
    redis.call('SREM', KEYS[2], suffix)
    redis.call('DEL', total)
  end
end
return forgotten
"""
)

_APPEND = (
    _HELPERS
    + """
-- KEYS: log, meta. ARGV: owner, minid ('' none), ttl_ms, done ('' unless the batch
-- ends with the terminal event), then for each entry of the batch: first, next
-- (last + 1), data
local after = ARGV[#ARGV - 1]  -- the batch's next sequence number
local written = tonumber(redis.call('HGET', KEYS[2], 'next') or '0')
if tonumber(after) <= written then
  return 0  -- this batch is stored already: a retried call
end
if redis.call('HGET', KEYS[2], 'done') then
  return 0  -- nothing follows the terminal event (a stalled replica's late frames)
end
local size = 0
for i = 5, #ARGV, 3 do
  redis.call('XADD', KEYS[1], '0-' .. ARGV[i + 1], 'f', ARGV[i], 'd', ARGV[i + 2])
  size = size + #ARGV[i + 2]
end
if ARGV[2] ~= '' then
  -- The entries below minid hold only events older than the newest replay_events
  -- (usually none or a few): count their bytes out, then trim them.
  local old = redis.call('XRANGE', KEYS[1], '-', '(' .. ARGV[2])
  if #old > 0 then
    for _, entry in ipairs(old) do
      size = size - #field(entry[2], 'd')
    end
    redis.call('XTRIM', KEYS[1], 'MINID', ARGV[2])
  end
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'next', after)
redis.call('HINCRBY', KEYS[2], 'bytes', int(size))
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[2], 'done', ARGV[4])
end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""
)

_FINISH = (
    _LOGS
    + """
-- KEYS: log, meta, retained, retained:bytes, retained:total.
-- ARGV: id, retention_ms, max_streams, max_bytes, prefix
local b = bounds(3, 2)
local written = redis.call('HGET', KEYS[2], 'next')
if not written then
  return {0}
end
if not redis.call('HGET', KEYS[2], 'done') then
  -- finished without a terminal frame (not the protocol): readers end at the last frame
  redis.call('HSET', KEYS[2], 'done', tostring(tonumber(written) - 1))
end
redis.call('PEXPIRE', KEYS[1], int(b.retention_ms))
redis.call('PEXPIRE', KEYS[2], int(b.retention_ms))
return retain_log(b, KEYS[2], ARGV[1])
"""
)

_TERMINATE = (
    _LOGS
    + """
-- KEYS: log, meta, retained, retained:bytes, retained:total.
-- ARGV: id, expected next, terminal frame, retention_ms, max_streams, max_bytes, prefix
local written = redis.call('HGET', KEYS[2], 'next')
if not written or redis.call('HGET', KEYS[2], 'done') then
  return {0}  -- no log, or it has its terminal event
end
if written ~= ARGV[2] then
  return {-1}  -- appended to since the frame was built: build it again
end
return end_log(bounds(3, 4), KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3])
"""
)

_DELETE_LOG = (
    _LOGS
    + """
-- KEYS: log, meta, retained, retained:bytes, retained:total.
-- ARGV: id, retention_ms, max_streams, max_bytes, prefix
local b = bounds(3, 2)
redis.call('DEL', KEYS[1], KEYS[2])
if redis.call('ZREM', b.index, ARGV[1]) == 1 then
  local sum = tonumber(redis.call('GET', b.total) or '0') - drop_log(b, ARGV[1])
  redis.call('SET', b.total, int(math.max(sum, 0)))
end
return {1, redis.call('ZCARD', b.index), tonumber(redis.call('GET', b.total) or '0')}
"""
)

_EXPIRE_LOGS = (
    _LOGS
    + """
-- KEYS: retained, retained:bytes, retained:total.
-- ARGV: retention_ms, max_streams, max_bytes, prefix
return trim_logs(bounds(1, 1))
"""
)

_CLAIM = (
    _LOGS
    + _RECORDS.removeprefix(_HELPERS)
    + """
-- KEYS: lease, running, record, log, meta, retained, retained:bytes, retained:total,
-- then the record's index (index, total, sizes, owners).
-- ARGV: id, replica, record json, record size, expected next ('' when the log needs
-- no terminal event), terminal frame, retention_ms, max_streams, max_bytes, prefix,
-- then the index's bounds (suffix, ttl_ms, max, max_bytes, prefix)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}  -- the replica is alive
end
if redis.call('HGET', KEYS[2], ARGV[1]) ~= ARGV[2] then
  return {0}  -- claimed by another replica already
end
local written = redis.call('HGET', KEYS[5], 'next')
local open = written and not redis.call('HGET', KEYS[5], 'done')
if ARGV[5] == '' then
  if open then return {-1} end
elseif not open or written ~= ARGV[5] then
  return {-1}  -- the log changed since the frame was built: build it again
end
local x = records(9, 11)
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('SET', KEYS[3], ARGV[3], 'PX', int(x.ttl_ms))
finished_record(x, ARGV[1], tonumber(ARGV[4]))
if ARGV[5] ~= '' then
  return end_log(bounds(6, 7), KEYS[4], KEYS[5], ARGV[1], ARGV[5], ARGV[6])
end
return {1}
"""
)

_OPEN = (
    _HELPERS
    + """
-- KEYS: log, meta. Returns {owner, next, done, first sequence number of the oldest entry}
-- (the oldest entry is read here, not sent: it may be large).
local meta = redis.call('HMGET', KEYS[2], 'owner', 'next', 'done')
local head = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)[1]
return {meta[1], meta[2], meta[3], head and field(head[2], 'f') or false}
"""
)

_READ = (
    _HELPERS
    + """
-- Every frame ends with a blank line and holds no other (SSE framing, compact JSON).
local function frame_end(data, from)  -- the last byte of the frame at `from`
  local at = string.find(data, '\\n\\n', from, true)
  if not at then error('a damaged event log entry') end
  return at + 1
end

-- KEYS: log, meta. ARGV: wanted (cursor + 1), budget (bytes), most entries.
-- Returns {done, meta exists (1/0), id, fields, id, fields, ...}: the frames from
-- `wanted` on, as stream entries, while within the budget (at least one frame).
-- An entry is cut to what is handed out (the frames after the cursor, those that
-- fit the budget) into one of the same form: fields f and d, id 0-{next}.
local meta = redis.call('HMGET', KEYS[2], 'owner', 'done')
local reply = {meta[2], meta[1] and 1 or 0}
local wanted, budget, left = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local start, size, largest = '(0-' .. ARGV[1], 0, 0
while left > 0 do
  -- One entry first (it may be large); then as many as the largest so far says fit.
  local count = 1
  if largest > 0 then
    count = math.max(1, math.min(left, math.floor((budget - size) / largest)))
  end
  local entries = redis.call('XRANGE', KEYS[1], start, '+', 'COUNT', int(count))
  for _, entry in ipairs(entries) do
    local id, fields = entry[1], entry[2]
    local data, first = field(fields, 'd'), tonumber(field(fields, 'f'))
    local from, to, cut = 1, #data, false
    while first < wanted do  -- the frames up to the cursor are not sent
      from, first, cut = frame_end(data, from) + 1, first + 1, true
    end
    if size + to - from + 1 > budget then
      if size > 0 then
        return reply
      end
      -- Over the budget alone: the frames that fit, at least one.
      local stop = frame_end(data, from)
      local ends = first + 1  -- the next sequence number after the cut
      while stop < to do
        local after = frame_end(data, stop + 1)
        if after - from + 1 > budget then break end
        stop, ends = after, ends + 1
      end
      to, cut, left = stop, true, 0
      id = '0-' .. int(ends)
    end
    if cut then
      fields = {'f', int(first), 'd', string.sub(data, from, to)}
    end
    reply[#reply + 1] = id
    reply[#reply + 1] = fields
    size = size + to - from + 1
    largest = math.max(largest, #data)
    start = '(' .. id
    left = left - 1
    if left <= 0 or size >= budget then
      return reply
    end
  end
  if #entries < count then
    break  -- the end of the log
  end
end
return reply
"""
)

_ITEM_SOURCES = 16
"""The sources an item index keeps (its newest) and a lookup checks, at most."""

_INDEX_ITEM = f"""
-- Index item `id` of `owner` as held by `source` (now), keeping the newest sources.
local function index_item(prefix, owner, id, source, ttl_ms)
  local key = prefix .. 'item:' .. owner .. ':' .. id
  local t = redis.call('TIME')
  redis.call('ZADD', key, tonumber(t[1]) * 1000000 + tonumber(t[2]), source)
  redis.call('ZREMRANGEBYRANK', key, 0, -{_ITEM_SOURCES + 1})
  redis.call('PEXPIRE', key, ttl_ms)
end

-- Forget that `source` holds item `id` of `owner`.
local function unindex_item(prefix, owner, id, source)
  redis.call('ZREM', prefix .. 'item:' .. owner .. ':' .. id, source)
end
"""

_INDEX_ITEMS = (
    _INDEX_ITEM
    + """
-- KEYS: none. ARGV: source ("r:" response id or "c:" conversation id), ttl_ms, prefix,
-- owner ("" without), then item ids. A source whose record is gone is skipped (and
-- forgotten) by the reader; the index lives no longer than its newest source's TTL.
for i = 5, #ARGV do
  index_item(ARGV[3], ARGV[4], ARGV[i], ARGV[1], ARGV[2])
end
return 1
"""
)

_CONVERSATIONS = (
    _RECORDS
    + _INDEX_ITEM
    + """
-- One conversation and its tenant's index: c = {meta, ids, items, index, total, sizes,
-- id, owner, ttl_ms, max, max_bytes, prefix}, from KEYS[1..6] and ARGV[1..6].
local function conv()
  return {meta = KEYS[1], ids = KEYS[2], items = KEYS[3], index = KEYS[4], total = KEYS[5],
          sizes = KEYS[6], id = ARGV[1], owner = ARGV[2], ttl_ms = tonumber(ARGV[3]),
          max = tonumber(ARGV[4]), max_bytes = tonumber(ARGV[5]), prefix = ARGV[6]}
end

local function mine(c)  -- the conversation exists and is the caller's
  local owner = redis.call('HGET', c.meta, 'owner')
  return owner and owner == c.owner
end

-- The conversation was used: refresh its TTLs and its place in the index, forget the
-- members the TTL removed, evict the least recently used beyond the bounds (never it).
local function used(c)
  local now = now_us()
  forget_stale(c.index, c.total, c.sizes, int(now - c.ttl_ms * 1000))
  local size = tonumber(redis.call('HGET', c.meta, 'bytes') or '0')
  local before = tonumber(redis.call('HGET', c.sizes, c.id) or '0')
  redis.call('ZADD', c.index, int(now), c.id)
  redis.call('HSET', c.sizes, c.id, int(size))
  local sum = tonumber(redis.call('INCRBY', c.total, int(size - before)))
  for _, key in ipairs({c.meta, c.ids, c.items}) do
    redis.call('PEXPIRE', key, int(c.ttl_ms))
  end
  local count = redis.call('ZCARD', c.index)
  while count > c.max or (count > 1 and sum > c.max_bytes) do
    local oldest = redis.call('ZRANGE', c.index, 0, 0)[1]
    if oldest == c.id then break end
    redis.call('ZREM', c.index, oldest)
    sum = sum - tonumber(redis.call('HGET', c.sizes, oldest) or '0')
    redis.call('HDEL', c.sizes, oldest)
    local key = c.prefix .. 'conversation:' .. oldest
    local owner = redis.call('HGET', key, 'owner')
    if owner then
      for _, item in ipairs(redis.call('LRANGE', key .. ':ids', 0, -1)) do
        unindex_item(c.prefix, owner, item, 'c:' .. oldest)
      end
    end
    redis.call('DEL', key, key .. ':ids', key .. ':items')
    count = count - 1
  end
  if sum < 0 then sum = 0 end
  redis.call('SET', c.total, int(sum))
end

-- Append items (ARGV[from..]: id, json pairs) not held yet; returns their ids.
local function add(c, from)
  local added = {}
  for i = from, #ARGV, 2 do
    if redis.call('HSETNX', c.items, ARGV[i], ARGV[i + 1]) == 1 then
      redis.call('RPUSH', c.ids, ARGV[i])
      redis.call('HINCRBY', c.meta, 'bytes', #ARGV[i + 1])
      index_item(c.prefix, c.owner, ARGV[i], 'c:' .. c.id, int(c.ttl_ms))
      added[#added + 1] = ARGV[i]
    end
  end
  return added
end
"""
)

_CONVERSATION_CREATE = (
    _CONVERSATIONS
    + """
-- ARGV[7]: the conversation object (JSON); ARGV[8..]: items (id, json pairs)
local c = conv()
local old = redis.call('HGET', c.meta, 'owner')
if old then
  for _, item in ipairs(redis.call('LRANGE', c.ids, 0, -1)) do
    unindex_item(c.prefix, old, item, 'c:' .. c.id)
  end
end
redis.call('DEL', c.meta, c.ids, c.items)
redis.call('HSET', c.meta, 'owner', c.owner, 'object', ARGV[7], 'bytes', int(#ARGV[7]))
add(c, 8)
used(c)
return 1
"""
)

_CONVERSATION_USE = (
    _CONVERSATIONS
    + """
-- ARGV[7]: what ('get', 'items', 'item', 'update', 'add', 'delete_item', 'lock'), then
-- its arguments. Returns false for an unknown conversation (or someone else's).
local c = conv()
if not mine(c) then return false end
local what = ARGV[7]
local reply = 1
if what == 'get' then
  reply = redis.call('HGET', c.meta, 'object')
elseif what == 'items' then
  local ids = redis.call('LRANGE', c.ids, 0, -1)
  reply = {}
  if #ids > 0 then reply = redis.call('HMGET', c.items, unpack(ids)) end
elseif what == 'item' then
  reply = redis.call('HGET', c.items, ARGV[8]) or ''
elseif what == 'update' then  -- ARGV[8]: the new object
  local old = redis.call('HGET', c.meta, 'object')
  redis.call('HSET', c.meta, 'object', ARGV[8])
  redis.call('HINCRBY', c.meta, 'bytes', #ARGV[8] - #old)
elseif what == 'add' then
  -- ARGV[8]: most items, ARGV[9]: most bytes ('' none), ARGV[10..]: id, json pairs
  local new, grown, seen = 0, 0, {}
  for i = 10, #ARGV, 2 do
    if not seen[ARGV[i]] and redis.call('HEXISTS', c.items, ARGV[i]) == 0 then
      seen[ARGV[i]] = true
      new = new + 1
      grown = grown + #ARGV[i + 1]
    end
  end
  local held = redis.call('LLEN', c.ids)
  if ARGV[8] ~= '' and held + new > tonumber(ARGV[8]) then return {-1, held} end
  local size = tonumber(redis.call('HGET', c.meta, 'bytes') or '0')
  if ARGV[9] ~= '' and size + grown > tonumber(ARGV[9]) then return {-2, held, size} end
  reply = add(c, 10)
  table.insert(reply, 1, 1)
elseif what == 'delete_item' then
  local item = redis.call('HGET', c.items, ARGV[8])
  if not item then
    reply = 0
  else
    redis.call('HDEL', c.items, ARGV[8])
    redis.call('LREM', c.ids, 0, ARGV[8])
    redis.call('HINCRBY', c.meta, 'bytes', -#item)
    unindex_item(c.prefix, c.owner, ARGV[8], 'c:' .. c.id)
  end
elseif what == 'lock' then  -- ARGV[8]: holder, ARGV[9]: lease in ms
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local holder = redis.call('HGET', c.meta, 'holder')
  local until_ms = tonumber(redis.call('HGET', c.meta, 'lock_until') or '0')
  if holder and holder ~= ARGV[8] and until_ms > now then
    reply = 0
  else
    redis.call('HSET', c.meta, 'holder', ARGV[8], 'lock_until', int(now + tonumber(ARGV[9])))
  end
end
used(c)
return reply
"""
)

_CONVERSATION_DELETE = (
    _CONVERSATIONS
    + """
local c = conv()
if not mine(c) then return 0 end
for _, item in ipairs(redis.call('LRANGE', c.ids, 0, -1)) do
  unindex_item(c.prefix, c.owner, item, 'c:' .. c.id)
end
redis.call('DEL', c.meta, c.ids, c.items)
if redis.call('ZREM', c.index, c.id) == 1 then
  redis.call('DECRBY', c.total, int(tonumber(redis.call('HGET', c.sizes, c.id) or '0')))
  redis.call('HDEL', c.sizes, c.id)
end
return 1
"""
)

_CONVERSATION_UNLOCK = """
-- KEYS: meta. ARGV: holder
if redis.call('HGET', KEYS[1], 'holder') == ARGV[1] then
  redis.call('HDEL', KEYS[1], 'holder', 'lock_until')
end
return 1
"""

_REQUEST_CANCEL = """
-- KEYS: lease, control. ARGV: response id, maxlen, ttl_ms
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[2], '*', 'id', ARGV[1])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
"""


@final
class _Redis:
    """What the three seams share: the clients, the scripts, this replica's id, and
    the figures of the finished-log index the scripts last reported."""

    def __init__(
        self,
        commands: coredis.Redis[bytes],
        blocking: coredis.Redis[bytes],
        config: Config,
    ) -> None:
        self.commands = commands
        self.blocking = blocking
        self.config = config
        self.replica = uuid.uuid4().hex
        self.retained = _Retained()
        self.bounds: list[str | bytes | int] = [
            _ms(config.stream_retention_s),
            config.max_retained_streams,
            config.retained_stream_bytes,
            PREFIX,
        ]
        """The trailing ARGV of the scripts that change the finished-log index."""
        self.scripts: list[Script[bytes]] = []
        self.put = self._script(_PUT)
        self.delete = self._script(_DELETE)
        self.expire_records = self._script(_EXPIRE_RECORDS)
        self.append = self._script(_APPEND)
        self.finish = self._script(_FINISH)
        self.terminate = self._script(_TERMINATE)
        self.delete_log = self._script(_DELETE_LOG)
        self.expire_logs = self._script(_EXPIRE_LOGS)
        self.claim = self._script(_CLAIM)
        self.open = self._script(_OPEN)
        self.read = self._script(_READ)
        self.request_cancel = self._script(_REQUEST_CANCEL)
        self.index_items = self._script(_INDEX_ITEMS)
        self.conversation_create = self._script(_CONVERSATION_CREATE)
        self.conversation_use = self._script(_CONVERSATION_USE)
        self.conversation_delete = self._script(_CONVERSATION_DELETE)
        self.conversation_unlock = self._script(_CONVERSATION_UNLOCK)

    def _script(self, source: str) -> Script[bytes]:
        script = self.commands.register_script(source)
        self.scripts.append(script)
        return script

    async def load_scripts(self) -> None:
        """Load every script into the server's cache, so that their first calls do not
        miss it (coredis retries a miss, logging it at INFO)."""
        for script in self.scripts:
            await _io(self.commands.script_load(script.script))

    async def call(
        self, script: Script[bytes], *, keys: Sequence[str], args: Sequence[str | bytes | int]
    ) -> Any:
        """Run one of the scripts above; its reply as coredis parses it."""
        request: Awaitable[Any] = script(keys=keys, args=args)
        return await _io(request)

    async def run(
        self, script: Script[bytes], *, keys: Sequence[str], args: Sequence[str | bytes | int]
    ) -> int:
        """Run one of the writing scripts above; its status.

        They answer an integer, or {status} or {status, retained count, retained
        bytes}: those figures are kept for `RedisEventLogs.statistics`.
        """
        reply = await self.call(script, keys=keys, args=args)
        if not isinstance(reply, list):
            return int(reply)
        if len(reply) == 3:
            self.retained.reported(int(reply[1]), int(reply[2]))
        return int(reply[0])

    async def log_end(self, response_id: str) -> int | None:
        """The next sequence number of a log still waiting for its terminal event."""
        written, done = await _io(self.commands.hmget(_meta_key(response_id), ["next", "done"]))
        if written is None or done is not None:
            return None
        return int(written)


def _encode_record(record: StoredResponse) -> tuple[bytes, int]:
    """The stored value of ``record`` and its size (`record_bytes`), from one encoding."""
    response = encoded(record.response).encode()
    input_items = encoded(record.input_items).encode()
    rest = _dumps(
        {"owner": record.owner, "replica": record.replica, "updated_at": record.updated_at}
    ).encode()
    value = b'{"response":%s,"input_items":%s,%s' % (response, input_items, rest[1:])
    return value, len(response) + len(input_items)


async def _encode_off_loop(record: StoredResponse) -> tuple[bytes, int]:
    """`_encode_record`, in a worker thread of the store's lane when the record is large."""
    estimate = estimated_size([record.response, record.input_items])
    return await offload(estimate, partial(_encode_record, record), lane="store")


def _decode_record(raw: bytes) -> StoredResponse:
    data = json.loads(raw)
    return StoredResponse(
        response=data["response"],
        input_items=data["input_items"],
        owner=data["owner"],
        replica=data["replica"],
        updated_at=data["updated_at"],
    )


@final
class RedisStore:
    """Implements `ResponseStore` on Redis keys (see the module docstring for the layout).

    A running record names the replica running it (``record.replica``); one
    without (None) belongs to no live replica, so any replica may recover it.
    A replica that stalls longer than its lease (a long pause, a partition)
    has its jobs recovered by others. If it comes back, its late writes are
    fenced off: a finished record is final (the put script refuses to replace
    it) and nothing is appended to a log after its terminal event; the lease
    check warns about it in the log.
    """

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis
        self._ttl_ms = _ms(redis.config.store_ttl_s)
        self._limits = StoreLimits.of(redis.config)

    def _index(self, owner: str | None) -> tuple[list[str], list[str | bytes | int]]:
        """The keys and the bounds of the index a record of ``owner`` is counted in
        (the trailing KEYS and ARGV of the scripts that change it)."""
        tenant = self._limits.tenant(owner)
        suffix = "" if tenant is None else f":{tenant}"
        keys = [_FINISHED + suffix, _STORED_TOTAL + suffix, _STORED_BYTES, _STORED_OWNERS]
        limits = self._limits
        bounds: list[str | bytes | int] = [
            suffix,
            self._ttl_ms,
            limits.share_responses,
            limits.share_bytes,
            PREFIX,
        ]
        return keys, bounds

    async def put(self, record: StoredResponse) -> None:
        """Write the record; a finished one is indexed in its owner's index, in the same
        script that evicts that index's oldest finished records beyond its share."""
        record = replace(record, updated_at=time.time())
        # Records can be large (long inputs): encode those off the event loop.
        value, size = await _encode_off_loop(record)
        index_keys, bounds = self._index(record.owner)
        await self._redis.run(
            self._redis.put,
            keys=[_record_key(record.id), _RUNNING, *index_keys],
            args=[
                value,
                record.id,
                record.replica or "",
                size,
                "1" if record.running else "",
                *bounds,
            ],
        )
        if not record.running and (item_ids := sorted(record.item_ids)):
            await self._redis.run(
                self._redis.index_items,
                keys=[],
                args=[f"r:{record.id}", self._ttl_ms, PREFIX, record.owner or "", *item_ids],
            )

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        """The item, from the newest finished record of ``owner`` the item index names."""
        return await _find_item(self._redis, item_id, owner, responses=self)

    async def get(self, response_id: str, *, owner: str | None) -> StoredResponse | None:
        raw = await _io(self._redis.commands.get(_record_key(response_id)))
        if raw is None:
            return None
        record = await offload(len(raw), partial(_decode_record, raw), lane="store")
        return record if record.owner == owner else None

    async def delete(self, response_id: str, *, owner: str | None) -> bool:
        if await self.get(response_id, owner=owner) is None:
            return False
        index_keys, bounds = self._index(owner)
        deleted = await self._redis.run(
            self._redis.delete,
            keys=[_record_key(response_id), _RUNNING, *index_keys],
            args=[response_id, *bounds],
        )
        return bool(deleted)

    async def expire(self) -> int:
        """Forget, in every index, the records their TTL removed; returns how many."""
        return await self._redis.run(
            self._redis.expire_records,
            keys=[_STORED_BYTES, _STORED_OWNERS],
            args=[self._ttl_ms, PREFIX],
        )

    async def recover_interrupted(self) -> list[StoredResponse]:
        """Claim, once, each running record of a replica whose lease is gone.

        One script per record checks the lease is still missing and removes the
        record from the running hash, then writes it ``failed``
        (``server_restarted``) and ends its log with that terminal event, all
        atomically: of several replicas recovering at once, exactly one claims
        each record, and no claimed record is left with an open log. Like `put`
        and `RedisEventLogs.finish`, the script keeps the finished records and
        logs within their bounds.
        """
        redis = self._redis
        running = await _io(redis.commands.hgetall(_RUNNING))
        by_replica: dict[str, list[str]] = {}
        for raw_id, raw_replica in running.items():
            by_replica.setdefault(raw_replica.decode(), []).append(raw_id.decode())
        recovered: list[StoredResponse] = []
        for replica, response_ids in by_replica.items():
            if replica == redis.replica:
                continue
            alive = bool(replica) and await _io(redis.commands.exists([_lease_key(replica)])) > 0
            if alive:
                continue  # its jobs are its own
            for response_id in response_ids:
                record = await self._claim(replica, response_id)
                if record is not None:
                    recovered.append(record)
        return recovered

    async def _claim(self, replica: str, response_id: str) -> StoredResponse | None:
        redis = self._redis
        for _ in range(_REBUILDS):
            raw = await _io(redis.commands.get(_record_key(response_id)))
            if raw is None:
                # Deleted (or evicted): nothing to recover, only the hash entry to drop.
                await _io(redis.commands.hdel(_RUNNING, [response_id]))
                return None
            record = replace(_decode_record(raw).interrupted(), updated_at=time.time())
            end = await redis.log_end(response_id)
            frame = b"" if end is None else terminal_frame(record.response, end)
            value, size = await _encode_off_loop(record)
            index_keys, bounds = self._index(record.owner)
            claimed = await redis.run(
                redis.claim,
                keys=[
                    _lease_key(replica),
                    _RUNNING,
                    _record_key(response_id),
                    _log_key(response_id),
                    _meta_key(response_id),
                    *_RETAINED_KEYS,
                    *index_keys,
                ],
                args=[
                    response_id,
                    replica,
                    value,
                    size,
                    "" if end is None else str(end),
                    frame,
                    *redis.bounds,
                    *bounds,
                ],
            )
            if claimed == 1:
                return record
            if claimed == 0:
                return None
            # -1: the log moved between reading it and the script (a writer thought
            # dead is still writing, or a retried append landed): read it again.
        logger.warning("%s: its log keeps changing; left for a later recovery", response_id)
        return None


async def _find_item(
    redis: _Redis,
    item_id: str,
    owner: str | None,
    *,
    responses: RedisStore | None = None,
    conversations: RedisConversations | None = None,
) -> dict[str, Any] | None:
    """An item of ``owner`` with ``item_id``: from the newest `_ITEM_SOURCES` sources
    its index names (of the kind asked for), checked against the records as they are
    now; a source that no longer holds the item is forgotten."""
    key = f"{PREFIX}item:{owner or ''}:{item_id}"
    newest = await _io(redis.commands.zrange(key, 0, _ITEM_SOURCES - 1, rev=True))
    gone: list[str] = []
    found: dict[str, Any] | None = None
    for source in (_text(raw) for raw in newest):
        kind, _, source_id = source.partition(":")
        if kind == "r" and responses is not None:
            record = await responses.get(source_id, owner=owner)
            if record is not None and not record.running and (item := record.item(item_id)):
                found = item
                break
            if record is None or not record.running:
                gone.append(source)
        elif kind == "c" and conversations is not None:
            found = await conversations.get_item(source_id, item_id, owner=owner)
            if found is not None:
                break
            gone.append(source)
    if gone:
        await _io(redis.commands.zrem(key, gone))
    return found


@final
class RedisConversations:
    """Implements `ConversationStore` on Redis keys (see the module docstring)."""

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis
        self._ttl_ms = _ms(redis.config.store_ttl_s)
        self._limits = StoreLimits.of(redis.config)

    def _keys_args(
        self, conversation_id: str, owner: str | None
    ) -> tuple[list[str], list[str | bytes | int]]:
        tenant = self._limits.tenant(owner)
        suffix = "" if tenant is None else f":{tenant}"
        key = _conversation_key(conversation_id)
        keys = [
            key,
            key + ":ids",
            key + ":items",
            _CONVERSATIONS_INDEX + suffix,
            _CONVERSATIONS_TOTAL + suffix,
            _CONVERSATIONS_BYTES,
        ]
        args: list[str | bytes | int] = [
            conversation_id,
            owner or "",
            self._ttl_ms,
            self._limits.share_responses,
            self._limits.share_bytes,
            PREFIX,
        ]
        return keys, args

    async def _use(self, conversation_id: str, owner: str | None, *what: str | bytes | int) -> Any:
        keys, args = self._keys_args(conversation_id, owner)
        return await self._redis.call(self._redis.conversation_use, keys=keys, args=[*args, *what])

    async def create(
        self, conversation: StoredConversation, items: Sequence[dict[str, Any]]
    ) -> None:
        keys, args = self._keys_args(conversation.id, conversation.owner)
        pairs = [value for item in items for value in (item["id"], encoded(item))]
        await self._redis.call(
            self._redis.conversation_create,
            keys=keys,
            args=[*args, encoded(conversation.conversation), *pairs],
        )

    async def get(self, conversation_id: str, *, owner: str | None) -> StoredConversation | None:
        raw = await self._use(conversation_id, owner, "get")
        return None if raw is None else StoredConversation(json.loads(raw), owner)

    async def update(
        self, conversation_id: str, metadata: dict[str, str], *, owner: str | None
    ) -> StoredConversation | None:
        current = await self.get(conversation_id, owner=owner)
        if current is None:
            return None
        conversation = {**current.conversation, "metadata": metadata}
        done = await self._use(conversation_id, owner, "update", encoded(conversation))
        return None if done is None else StoredConversation(conversation, owner)

    async def delete(self, conversation_id: str, *, owner: str | None) -> bool:
        keys, args = self._keys_args(conversation_id, owner)
        deleted = await self._redis.call(self._redis.conversation_delete, keys=keys, args=args)
        return bool(deleted)

    async def items(
        self, conversation_id: str, *, owner: str | None
    ) -> list[dict[str, Any]] | None:
        raw = await self._use(conversation_id, owner, "items")
        if raw is None:
            return None
        return await offload(
            sum(len(item) for item in raw if item is not None),
            lambda: [json.loads(item) for item in raw if item is not None],
            lane="store",
        )

    async def add_items(
        self,
        conversation_id: str,
        items: Sequence[dict[str, Any]],
        *,
        owner: str | None,
        max_items: int | None = None,
        max_bytes: int | None = None,
    ) -> list[dict[str, Any]] | None:
        pairs = [value for item in items for value in (item["id"], encoded(item))]
        most = "" if max_items is None else str(max_items)
        most_bytes = "" if max_bytes is None else str(max_bytes)
        reply = await self._use(conversation_id, owner, "add", most, most_bytes, *pairs)
        if reply is None:
            return None
        if int(reply[0]) == -1:
            raise ConversationFull(int(reply[1]))
        if int(reply[0]) == -2:
            raise ConversationFull(int(reply[1]), held_bytes=int(reply[2]))
        added = {_text(raw) for raw in reply[1:]}
        return [item for item in items if item["id"] in added]

    async def get_item(
        self, conversation_id: str, item_id: str, *, owner: str | None
    ) -> dict[str, Any] | None:
        raw = await self._use(conversation_id, owner, "item", item_id)
        if not raw:
            return None
        item: dict[str, Any] = json.loads(raw)
        return item

    async def delete_item(self, conversation_id: str, item_id: str, *, owner: str | None) -> bool:
        return bool(await self._use(conversation_id, owner, "delete_item", item_id))

    async def find_item(self, item_id: str, *, owner: str | None) -> dict[str, Any] | None:
        return await _find_item(self._redis, item_id, owner, conversations=self)

    async def lock(
        self, conversation_id: str, holder: str, *, owner: str | None, lease_s: float
    ) -> bool | None:
        reply = await self._use(conversation_id, owner, "lock", holder, _ms(lease_s))
        return None if reply is None else bool(reply)

    async def unlock(self, conversation_id: str, holder: str) -> None:
        await self._redis.call(
            self._redis.conversation_unlock,
            keys=[_conversation_key(conversation_id)],
            args=[holder],
        )

    async def expire(self) -> int:
        await trio.lowlevel.checkpoint()
        return 0  # the keys' TTLs expire them; the indexes forget them when next used


@final
class _Retained:
    """What `RedisEventLogs.statistics` reports, kept without I/O.

    The finished logs are the shared index's figures (all replicas' logs) as the
    last script that changed it reported them (a finish, a delete, `expire`,
    which the service runs periodically); the running logs are those this
    process appends to.
    """

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self._finished = 0
        self._finished_bytes = 0

    def appended(self, response_id: str, size: int) -> None:
        self.running[response_id] = self.running.get(response_id, 0) + size

    def reported(self, streams: int, size: int) -> None:
        self._finished, self._finished_bytes = streams, size

    def statistics(self) -> LogStatistics:
        return LogStatistics(
            retained_streams=len(self.running) + self._finished,
            retained_bytes=sum(self.running.values()) + self._finished_bytes,
        )


def _split(entry: StreamEntry) -> tuple[int, list[bytes]]:
    """The first sequence number and the frames of one stream entry."""
    fields = entry.field_values
    first = int(fields[b"f"])
    raw_id = _raw(entry.identifier)
    try:
        frames = split_frames(_raw(fields[b"d"]))
    except ValueError:
        frames = []
    if not frames or int(raw_id.partition(b"-")[2]) != first + len(frames):
        raise StoreError(f"The response store holds a damaged event log entry ({raw_id!r}).")
    return first, frames


def _frames_after(entries: Sequence[StreamEntry], cursor: int) -> list[bytes]:
    """The frames after ``cursor`` in ``entries``, contiguous from ``cursor + 1``.

    Raises:
        SubscriberLagged: frame ``cursor + 1`` is not there (trimmed, or a hole
            the producer left when it fell behind).
    """
    wanted = cursor + 1
    frames: list[bytes] = []
    for entry in entries:
        first, batch = _split(entry)
        if first + len(batch) <= wanted:
            continue  # all at or before the cursor
        if first > wanted:
            if frames:
                break  # hand out what is contiguous; the next read reports the hole
            raise SubscriberLagged(wanted, first)
        frames.extend(batch[wanted - first :])
        wanted = first + len(batch)
    return frames


def _entries_of(frames: Sequence[bytes], first: int) -> list[str | bytes | int]:
    """`_APPEND`'s entries of frames ``first …``: (first, next, data) for each run of
    frames within `_ENTRY_BYTES` (at least one frame), flattened."""
    flat: list[str | bytes | int] = []
    start, size = 0, 0
    for index, frame in enumerate(frames):
        if index > start and size + len(frame) > _ENTRY_BYTES:
            flat += [first + start, first + index, b"".join(frames[start:index])]
            start, size = index, 0
        size += len(frame)
    flat += [first + start, first + len(frames), b"".join(frames[start:])]
    return flat


def _entries(flat: Sequence[Any]) -> list[StreamEntry]:
    """Stream entries from a script's reply: id, fields, id, fields, ..."""
    return [
        StreamEntry(
            identifier=flat[index],
            field_values=OrderedDict(zip(flat[index + 1][::2], flat[index + 1][1::2], strict=True)),
        )
        for index in range(0, len(flat), 2)
    ]


@final
class _LogReader:
    """Implements `LogReader` over one log's stream (`RedisEventLogs.open`).

    Each read takes at most `_READ_BYTES` of frames (at least one) in one script
    that also reads the log's meta; only when nothing follows the cursor does it
    wait for the writer, in ``XREAD BLOCK``, which hands out the one entry it
    wakes up to (written in the last moments) whole.
    """

    def __init__(self, redis: _Redis, response_id: str, done: int | None) -> None:
        self._redis = redis
        self._log = _log_key(response_id)
        self._meta = _meta_key(response_id)
        self._done = done

    async def read_after(self, cursor: int) -> list[bytes]:
        if self._done is not None and cursor >= self._done:
            await trio.lowlevel.checkpoint()
            return []
        reply = await self._redis.call(
            self._redis.read,
            keys=[self._log, self._meta],
            args=[cursor + 1, _READ_BYTES, _READ_ENTRIES],
        )
        done, exists = reply[0], int(reply[1])
        entries = _entries(reply[2:])
        if done is not None:
            self._done = int(done)
        if not entries:
            if self._done is not None:
                if cursor >= self._done:
                    return []
                # Complete, yet what follows the cursor is gone (trimmed meanwhile).
                raise SubscriberLagged(cursor + 1, self._done + 1)
            if not exists:
                self._done = cursor  # deleted or expired: nothing more will come
                return []
            entries = await self._follow(_entry_id(cursor + 1))
            if not entries:
                # Quiet for a while: finished meanwhile (without a frame for this
                # reader), deleted, or expired? Otherwise the caller asks again.
                owner, done = await _io(self._redis.commands.hmget(self._meta, ["owner", "done"]))
                if done is not None:
                    self._done = int(done)
                elif owner is None:
                    self._done = cursor  # the log is gone: nothing more will come
                return []
        frames = _frames_after(entries, cursor)
        if frames and is_terminal_frame(frames[-1]):
            self._done = cursor + len(frames)
        return frames

    async def _follow(self, after: str) -> list[StreamEntry]:
        """The next entry after ``after``, once the writer adds it (``[]`` after a while).

        On the blocking client; if cancelled, coredis drops its connection (the
        reply can never reach another command) and `_Pool` recycles the slot. One
        entry (a batch written within the last moments) keeps the read bounded.
        """
        reply = await _io(self._redis.blocking.xread({self._log: after}, count=1, block=_BLOCK_MS))
        return list(reply.get(self._log.encode(), ())) if reply else []

    def complete_through(self) -> int | None:
        return self._done

    def close(self) -> None:
        pass  # holds nothing between reads


@final
class RedisEventLogs:
    """Implements `EventLogStore` with one Redis Stream per response (live)."""

    live = True
    # Readers on other replicas follow the log: a few milliseconds of gathering keep
    # them close behind while a fast producer still writes one entry per window.
    write_interval_s = 0.005

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis
        config = redis.config
        self._replay_events = config.replay_events
        self._safety_ttl_ms = _ms(config.store_ttl_s)
        self._retained = redis.retained

    async def append(
        self, response_id: str, frames: Sequence[bytes], *, first: int, owner: str | None
    ) -> None:
        if not frames:
            await trio.lowlevel.checkpoint()
            return
        after = first + len(frames)  # the next sequence number once these are stored
        min_id = after - self._replay_events + 1  # entries below hold only older events
        entries = _entries_of(frames, first)
        stored = await self._redis.run(
            self._redis.append,
            keys=[_log_key(response_id), _meta_key(response_id)],
            args=[
                _dumps(owner),
                _entry_id(min_id) if min_id > 1 else "",
                # A log whose job dies unnoticed still goes, eventually.
                self._safety_ttl_ms,
                after - 1 if is_terminal_frame(frames[-1]) else "",
                *entries,
            ],
        )
        if stored:  # not a retried call
            self._retained.appended(response_id, sum(map(len, frames)))

    async def finish(self, response_id: str, log: EventLog, *, owner: str | None) -> None:
        """Set the log's retention and index it in ``retained``, in the script that
        evicts the oldest finished logs beyond the count and byte limits."""
        # The frames are in Redis already (`append`); `log` is the in-process copy.
        await self._redis.run(
            self._redis.finish,
            keys=[_log_key(response_id), _meta_key(response_id), *_RETAINED_KEYS],
            args=[response_id, *self._redis.bounds],
        )
        self._retained.running.pop(response_id, None)

    async def open(
        self, response_id: str, *, owner: str | None, starting_after: int
    ) -> Subscription | None:
        stored_owner, written, done, head = await self._redis.call(
            self._redis.open, keys=[_log_key(response_id), _meta_key(response_id)], args=[]
        )
        if stored_owner is None or written is None or json.loads(stored_owner) != owner:
            return None
        oldest = int(head) if head is not None else int(written)
        if starting_after + 1 < oldest:
            raise SubscriberLagged(starting_after + 1, oldest)
        reader = _LogReader(self._redis, response_id, None if done is None else int(done))
        return ReaderSubscription(reader, starting_after)

    async def terminate(self, record: StoredResponse) -> None:
        redis = self._redis
        for _ in range(_REBUILDS):
            end = await redis.log_end(record.id)
            if end is None:
                return  # no log, or it has its terminal event
            ended = await redis.run(
                redis.terminate,
                keys=[_log_key(record.id), _meta_key(record.id), *_RETAINED_KEYS],
                args=[record.id, str(end), terminal_frame(record.response, end), *redis.bounds],
            )
            if ended != -1:
                return
        raise StoreError(f"The event log of {record.id} keeps changing; it was not ended.")

    async def delete(self, response_id: str) -> None:
        await self._redis.run(
            self._redis.delete_log,
            keys=[_log_key(response_id), _meta_key(response_id), *_RETAINED_KEYS],
            args=[response_id, *self._redis.bounds],
        )
        self._retained.running.pop(response_id, None)

    async def expire(self) -> int:
        """Forget, in ``retained``, the logs their TTL removed; returns how many."""
        return await self._redis.run(
            self._redis.expire_logs, keys=list(_RETAINED_KEYS), args=self._redis.bounds
        )

    def statistics(self) -> LogStatistics:
        """The finished logs of all replicas, as the last script that changed their
        index reported them, plus the logs this process is writing.

        Approximate: other replicas' finishes since, and per-log trimming while
        running, are not counted.
        """
        return self._retained.statistics()


@final
class RedisControl:
    """Implements `Control`: a lease per replica and a control stream of cancel messages."""

    def __init__(self, redis: _Redis) -> None:
        self._redis = redis
        self.replica = redis.replica
        config = redis.config
        self._lease_ms = _ms(config.job_lease_s)
        self._beat_s = config.job_lease_s / 3
        self._control_ttl_ms = _ms(max(60.0, 3 * config.job_lease_s))
        self._cleanup_s = config.cleanup_timeout_s
        self._lease = _lease_key(self.replica)
        self._control = _control_key(self.replica)
        self._lease_value = f"{socket.gethostname()}:{os.getpid()}"

    async def run(
        self,
        on_cancel: CancelHandler,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> NoReturn:
        """Heartbeat the lease and deliver cancel messages, until cancelled.

        Reports started once the lease is set. Messages are read from the start
        of this replica's control stream (new with the replica id), so none sent
        after that is missed. Backend errors are logged and retried with backoff;
        on cancellation the lease is removed so others may recover at once.
        """
        started = False
        last_id = "0-0"
        next_beat = trio.current_time()
        delay = _RETRY_FIRST_S
        try:
            while True:
                try:
                    if trio.current_time() >= next_beat:
                        await self._beat(first=not started)
                        next_beat = trio.current_time() + self._beat_s
                        if not started:
                            started = True
                            task_status.started()
                    wait_ms = math.ceil((next_beat - trio.current_time()) * 1000)
                    reply = await _io(
                        self._redis.blocking.xread(
                            {self._control: last_id},
                            count=100,
                            block=min(_BLOCK_MS, max(1, wait_ms)),
                        )
                    )
                    for entry in (reply or {}).get(self._control.encode(), ()):
                        last_id = _text(entry.identifier)
                        response_id = _text(entry.field_values[b"id"])
                        try:
                            on_cancel(response_id)
                        except Exception:
                            logger.exception("cancel handler failed for %s", response_id)
                    delay = _RETRY_FIRST_S
                except StoreError as error:
                    logger.warning("control loop: %s; retrying in %.2f s", error, delay)
                    await trio.sleep(delay)
                    delay = min(delay * 2, _RETRY_MAX_S)
        finally:
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + self._cleanup_s
                try:
                    await _io(self._redis.commands.delete([self._lease, self._control]))
                except StoreError as error:
                    logger.warning("could not remove this replica's lease: %s", error)

    async def _beat(self, *, first: bool) -> None:
        commands = self._redis.commands
        if not first:
            refreshed = await _io(
                commands.set(
                    self._lease, self._lease_value, px=self._lease_ms, condition=PureToken.XX
                )
            )
            if refreshed:
                return
            logger.warning(
                "replica %s: its lease expired before this heartbeat; other replicas may "
                "have ended its responses as server_restarted",
                self.replica,
            )
        await _io(commands.set(self._lease, self._lease_value, px=self._lease_ms))

    async def request_cancel(self, record: StoredResponse) -> bool:
        replica = record.replica
        if not replica:
            await trio.lowlevel.checkpoint()
            return False
        sent = await self._redis.run(
            self._redis.request_cancel,
            keys=[_lease_key(replica), _control_key(replica)],
            args=[record.id, _CONTROL_MAXLEN, self._control_ttl_ms],
        )
        return bool(sent)


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _raw(value: str | bytes) -> bytes:
    return value if isinstance(value, bytes) else value.encode()


def _client(
    url: str, *, stream_timeout_s: float, max_connections: int | None
) -> coredis.Redis[bytes]:
    pool = _Pool.from_url(
        url,
        decode_responses=False,
        stream_timeout=stream_timeout_s,
        connect_timeout=_CONNECT_TIMEOUT_S,
        max_connections=max_connections,
        # Waiting longer than this for a (new) connection is a failure, not a hang.
        timeout=_CONNECT_TIMEOUT_S,
    )
    return coredis.Redis(connection_pool=pool, decode_responses=False)


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
